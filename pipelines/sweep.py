"""Stage ``make sweep``: RL variants from one SFT start per seed, each evaluated on the test split, in one table.

The sweep file (``SWEEP=configs/sweeps/<name>.yaml``) gives ``variants`` (name -> overrides on top of the run
config and the command line's) and optionally ``config`` (the run config when ``--config`` is not given;
default ``configs/demo.yaml``), ``overrides`` (for every run), ``seeds`` (default [0]), ``steps`` (RL steps per
run) and ``out`` (default ``outputs/sweeps/<name>``). Per seed the tiny model, the
data and the SFT policy are built once, as the demo builds them; every variant's RL run starts from that SFT
checkpoint. A run's row: test accuracy, its gain over the SFT start, the median seconds per step, and over
its last tenth of steps the share of flat groups (every reward of the group equal), of all-wrong groups and the
entropy. Every run is kept, failed ones too (with their error): ``<out>/sweep.json`` and the markdown table
``<out>/sweep.md`` are rewritten as each run finishes, so a stopped sweep keeps its rows, and a later sweep into
the same ``out`` keeps the earlier rows of the other (variant, seed) pairs. ``--seeds 1,2`` and
``--variants a,b`` run a part of the sweep file.

    python -m pipelines.sweep --sweep configs/sweeps/counting.yaml
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

import yaml
from mlflow.tracking import MlflowClient

from mmrl.models.tiny import build_tiny_vlm
from mmrl.trainer.tracking import tracking_uri
from mmrl.trainer.eval_checkpoint import run_eval
from mmrl.trainer.run import run_rl
from mmrl.trainer.sft import run_sft
from pipelines import data, model
from pipelines.cli import Command, quiet_third_party

SPEC_KEYS = {"config", "out", "overrides", "seeds", "steps", "variants"}
DEFAULT_CONFIG = "configs/demo.yaml"

# Averaged over the last tenth of a run's steps: (column, metric).
LATE = (("flat", "critic/flat_groups"), ("all_wrong", "critic/flat_groups_all_wrong"), ("entropy", "actor/entropy"))


def late_mean(client: MlflowClient, run_id: str, metric: str) -> float | None:
    """The mean of ``metric`` over the last tenth (at least one) of its logged steps; None when never logged."""
    history = sorted(client.get_metric_history(run_id, metric), key=lambda p: p.step)
    if not history:
        return None
    tail = history[-max(1, len(history) // 10):]
    return statistics.fmean(p.value for p in tail)


def run_row(client: MlflowClient, run_id: str) -> dict[str, float | None]:
    steps = [p.value for p in client.get_metric_history(run_id, "timing_s/step")]
    return {"s_per_step": statistics.median(steps) if steps else None,
            **{column: late_mean(client, run_id, metric) for column, metric in LATE}}


def prepare_seed(command: Command, out: Path, seed: int) -> tuple[list[str], float]:
    """The seed's model, data and SFT checkpoint under ``out``; (its overrides for the RL runs, SFT test acc)."""
    where = [f"seed={seed}", f"model.path={out}/model", f"data.dir={out}/data", f"sft.out_dir={out}/sft"]
    cfg = command.load(*where)
    build_tiny_vlm(model.task_corpus(cfg), cfg.tiny_model, cfg.model.path, cfg.seed, cfg.model.family)
    data.synthetic(cfg)
    checkpoint = run_sft(cfg)["checkpoint"]
    sft_acc = run_eval(cfg, checkpoint, f"sweep-sft-seed{seed}")["accuracy"]["all"]
    return [*where, f"trainer.init={checkpoint}", "trainer.resume=never"], sft_acc


def load_spec(path: str | Path) -> dict[str, Any]:
    """The sweep file at ``path``, checked: known keys only, and at least one variant."""
    spec = yaml.safe_load(Path(path).read_text()) or {}
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise ValueError(f"sweep file {path}: unknown keys {unknown}; the keys are {sorted(SPEC_KEYS)}")
    if not spec.get("variants"):
        raise ValueError(f"sweep file {path}: no variants; give `variants: {{name: [overrides...]}}`")
    return spec


def merge_rows(earlier: list[dict[str, Any]], row: dict[str, Any]) -> list[dict[str, Any]]:
    """``earlier`` with ``row`` in place of the row of the same (variant, seed), else appended."""
    def same(r: dict[str, Any]) -> bool:
        return (r["variant"], r["seed"]) == (row["variant"], row["seed"])

    if any(same(r) for r in earlier):
        return [row if same(r) else r for r in earlier]
    return [*earlier, row]


def select(spec: dict[str, Any], seeds: str | None, variants: str | None) -> tuple[list[int], dict[str, list[str]]]:
    """The seeds and variants to run: the sweep file's, or the named part of them (an unknown name is an error)."""
    all_seeds, all_variants = list(spec.get("seeds", [0])), spec["variants"]
    chosen_seeds = [int(s) for s in seeds.split(",")] if seeds else all_seeds
    names = variants.split(",") if variants else list(all_variants)
    unknown = [n for n in names if n not in all_variants]
    if unknown:
        raise ValueError(f"--variants {unknown} not in the sweep file; its variants: {list(all_variants)}")
    return chosen_seeds, {n: all_variants[n] for n in names}


def markdown(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else ("" if value is None else str(value))

    columns = ["variant", "seed", "sft_acc", "test_acc", "gain", "s_per_step", "flat", "all_wrong", "entropy",
               "minutes", "error"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=None,
                        help=f"the run config (default: the sweep file's `config`, else {DEFAULT_CONFIG})")
    parser.add_argument("--sweep", required=True, help="the sweep file: seeds, steps, variants")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds to run (default: the sweep file's)")
    parser.add_argument("--variants", default=None, help="comma-separated variants to run (default: all)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    quiet_third_party()
    spec = load_spec(args.sweep)
    out = Path(spec.get("out", f"outputs/sweeps/{Path(args.sweep).stem}"))
    config = args.config or spec.get("config", DEFAULT_CONFIG)
    command = Command(config, (*spec.get("overrides", []), *args.overrides))
    seeds, variants = select(spec, args.seeds, args.variants)
    table = out / "sweep.json"
    rows: list[dict[str, Any]] = json.loads(table.read_text()) if table.exists() else []
    for seed in seeds:
        where, sft_acc = prepare_seed(command, out / f"seed{seed}", seed)
        for name, overrides in variants.items():
            row = run_variant(command, out, seed, name, [*where, *overrides], spec.get("steps"), sft_acc)
            rows = merge_rows(rows, row)
            out.mkdir(parents=True, exist_ok=True)
            (out / "sweep.json").write_text(json.dumps(rows, indent=2))
            (out / "sweep.md").write_text(markdown(rows))
            print(markdown(rows), flush=True)
    return rows


def run_variant(command: Command, out: Path, seed: int, name: str, overrides: list[str], steps: int | None,
                sft_acc: float) -> dict[str, Any]:
    """One RL run of a variant and its test evaluation: its row of the table (an ``error`` when it failed)."""
    start = time.time()
    row: dict[str, Any] = {"variant": name, "seed": seed, "sft_acc": sft_acc, "overrides": overrides}
    run_dir = out / f"seed{seed}" / name
    extra = [f"trainer.out_dir={run_dir}", f"trainer.run_name=sweep-{name}-seed{seed}"]
    extra += [f"trainer.steps={steps}"] if steps else []
    try:
        cfg = command.load(*overrides, *extra)
        result = run_rl(cfg)
        acc = run_eval(cfg, str(run_dir / "checkpoint"), f"sweep-{name}-seed{seed}")["accuracy"]["all"]
        client = MlflowClient(tracking_uri(cfg.tracking))
        row |= {"test_acc": acc, "gain": acc - sft_acc, "mlflow_run_id": result["mlflow_run_id"],
                **run_row(client, result["mlflow_run_id"])}
    except (Exception, SystemExit) as err:  # a failed run is a row of the table too
        row["error"] = f"{type(err).__name__}: {err}".splitlines()[0][:200]
        traceback.print_exc()
    row["minutes"] = round((time.time() - start) / 60, 2)
    return row


if __name__ == "__main__":
    main()
