"""Stage ``make results``: run the learning matrix, keep one record per run, render ``docs/results.md``.

The matrix (``results/matrix.yaml``) names each demo: its config, extra overrides and seeds. Every run is
``python -m pipelines.demo --config <config> seed=<N> <args>`` in a process of its own (as a user runs it); its
record, ``results/<entry>/seed<N>.json``, holds the commit, the config and its hash, the command, the seed, the
accuracies, the bar and whether it was met, the wall and RL times, the MLflow run id, the curves (val accuracy,
mean score, entropy per step) and the machine. ``docs/results.md`` (tables) and ``docs/results/<entry>.png``
(curves) are rendered from every record under ``results/``, so each figure there names the run it came from.

    python -m pipelines.results                        # every entry, every seed, then render
    python -m pipelines.results --only demo --seeds 0  # one entry, one seed, then render
    python -m pipelines.results --render              # render only
    python -m pipelines.results --check               # exit 1 when docs/results.md differs from the records
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from mmrl.config import BarConfig

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / "results/matrix.yaml"
RESULTS = ROOT / "results"
DOC = ROOT / "docs/results.md"
CURVES = {"val_acc": "val/acc", "score": "critic/score/mean", "entropy": "actor/entropy"}
ENTRY_KEYS = {"config", "seeds", "args", "title", "group", "note", "demo"}
SUMMARY = ROOT / "outputs/demo/summary.json"


# ---- the matrix -------------------------------------------------------------------------------------------

def load_matrix(path: Path = MATRIX) -> dict[str, dict[str, Any]]:
    """The matrix file's entries, checked: known keys, a config that exists, integer seeds."""
    matrix = yaml.safe_load(path.read_text()) or {}
    for name, entry in matrix.items():
        unknown = sorted(set(entry) - ENTRY_KEYS)
        if unknown:
            raise ValueError(f"{path}: entry {name!r} has unknown keys {unknown}; the keys are {sorted(ENTRY_KEYS)}")
        if "config" not in entry or not (ROOT / entry["config"]).is_file():
            raise ValueError(f"{path}: entry {name!r} needs `config:` naming a file under {ROOT}")
        entry.setdefault("seeds", [0])
        entry.setdefault("args", [])
        if not all(isinstance(s, int) for s in entry["seeds"]):
            raise ValueError(f"{path}: entry {name!r}: seeds must be integers, got {entry['seeds']}")
    return matrix


def select(matrix: dict[str, dict[str, Any]], only: str | None, seeds: str | None) -> list[tuple[str, int]]:
    """The (entry, seed) runs asked for: the whole matrix, or the entries of ``only`` (comma-separated) on the
    seeds of ``seeds`` (comma-separated; default: each entry's own)."""
    names = only.split(",") if only else list(matrix)
    unknown = [n for n in names if n not in matrix]
    if unknown:
        raise ValueError(f"ONLY={','.join(unknown)} is not in {MATRIX.name}; its entries: {', '.join(matrix)}")
    chosen = [int(s) for s in seeds.split(",")] if seeds else None
    return [(name, seed) for name in names for seed in (chosen if chosen is not None else matrix[name]["seeds"])]


# ---- one run --------------------------------------------------------------------------------------------

def machine(matmul_gflops: float | None = None) -> dict[str, Any]:
    """The machine a run ran on: CPU model, cores, torch threads, the library versions that set its numbers, and
    ``matmul_gflops`` (:func:`matmul_speed`, measured as the run started) when given."""
    import torch
    import transformers

    cpu = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            **({} if matmul_gflops is None else {"matmul_gflops": matmul_gflops})}


def matmul_speed() -> float:
    """GFLOP/s of a float32 2048-square matmul on the CPU with the process's threads (the best of about a second).

    Machines of one CPU model and core count differ in speed from day to day (a shared host), so a run's times are
    read against this: a slow run on a slow machine says nothing about the code."""
    import torch

    from mmrl.perf.peak import matmul_rate

    return round(matmul_rate(2048, 2048, 2048, torch.device("cpu"), torch.float32, seconds=1.0) / 1e9, 1)


def commit() -> str:
    from mmrl.trainer.tracking import git_commit

    return git_commit()


def config_hash(config: str, overrides: list[str]) -> str:
    """sha256 (16 hex digits) of the run's resolved config as the keys it reads (:func:`mmrl.run_config.run_dict`:
    a loss or an algorithm added to the tables leaves it as it is), without its bar: equal hashes, equal runs. The bar
    (``bar.*``) judges a run and does not change it, so the page judges each record against its entry's current
    bar (:func:`judge`) and a changed bar leaves the record current."""
    from mmrl.run_config import load_run_config, run_dict

    resolved = run_dict(load_run_config(ROOT / config, overrides))
    resolved.pop("bar", None)
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()[:16]


def entry_bar(config: str, overrides: list[str]) -> BarConfig:
    """The bar an entry's run is held to now: ``bar.*`` of its resolved config."""
    from mmrl.run_config import load_run_config

    return load_run_config(ROOT / config, overrides).bar


def judge(record: dict[str, Any], bar: BarConfig) -> dict[str, Any]:
    """``record`` with its ``bar`` re-checked against ``bar`` (the check ``make demo`` prints); a failed run, which
    has no accuracies, is returned as it is."""
    from pipelines.demo import check_bar

    if "rl_acc" not in record or "sft_acc" not in record:
        return record
    rl_seconds = record.get("stage_seconds", {}).get("rl", record.get("rl_minutes", 0) * 60)
    summary = {"sft_acc": record["sft_acc"], "rl_acc": record["rl_acc"], "stage_seconds": {"rl": rl_seconds}}
    return {**record, "bar": check_bar(bar, summary)}


def curves(run_id: str, config: str, overrides: list[str]) -> dict[str, list[list[float]]]:
    """The run's logged curves, ``name -> [[step, value], ...]``, read back from its MLflow store."""
    from mlflow.tracking import MlflowClient

    from mmrl.run_config import load_run_config
    from mmrl.trainer.tracking import tracking_uri

    client = MlflowClient(tracking_uri(load_run_config(ROOT / config, overrides).tracking))
    out = {}
    for name, metric in CURVES.items():
        history = sorted(client.get_metric_history(run_id, metric), key=lambda p: p.step)
        out[name] = [[p.step, round(p.value, 4)] for p in history]
    return out


def run_one(name: str, entry: dict[str, Any], seed: int) -> dict[str, Any]:
    """Run ``entry`` on ``seed`` as ``make demo`` would; write and return its record."""
    overrides = [f"seed={seed}", *entry["args"]]
    command = [sys.executable, "-m", "pipelines.demo", "--config", entry["config"], *overrides]
    log_path = ROOT / "outputs/results" / f"{name}-seed{seed}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.unlink(missing_ok=True)
    print(f"results: {name} seed {seed}: {' '.join(command[1:])} (log: {log_path.relative_to(ROOT)})", flush=True)
    speed = matmul_speed()
    start, code = time.time(), commit()  # the code the run starts from
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:  # the demo's progress, shown as it runs and kept in the log
            log.write(line)
            if line.startswith(("step ", "demo:")):
                print(f"  {line}", end="", flush=True)
        returncode = proc.wait()
    record: dict[str, Any] = {
        "entry": name, "title": entry.get("title", name), "group": entry.get("group", ""), "seed": seed,
        "commit": code, "config": entry["config"], "args": entry["args"],
        "config_sha256": config_hash(entry["config"], overrides), "command": " ".join(["python", *command[1:]]),
        "returncode": returncode, "wall_minutes": round((time.time() - start) / 60, 2),
        "machine": machine(speed),
    }
    if SUMMARY.exists():
        summary = json.loads(SUMMARY.read_text())
        record |= {key: summary[key] for key in ("sft_acc", "rl_acc", "rl_steps", "mlflow_run_id", "stage_seconds",
                                                 "bar") if key in summary}
        record |= {key: summary[key] for key in summary if key.endswith("_no_tools")}
        record["gain"] = round(summary["rl_acc"] - summary["sft_acc"], 4)
        record["rl_minutes"] = round(summary["stage_seconds"]["rl"] / 60, 2)
        record["curves"] = curves(summary["mlflow_run_id"], entry["config"], overrides)
    else:
        record["error"] = "".join(log_path.read_text().splitlines(keepends=True)[-20:])
    path = RESULTS / name / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_record(record))
    return record


def dump_record(record: dict[str, Any]) -> str:
    """A record as JSON, one key a line, each curve on a line of its own (a diff shows which value moved)."""
    curves_ = record.get("curves", {})
    head = json.dumps({k: v for k, v in record.items() if k != "curves"}, indent=1)
    if not curves_:
        return head + "\n"
    lines = ",\n".join(f"  {json.dumps(name)}: {json.dumps(points)}" for name, points in curves_.items())
    return head[:-2] + ',\n "curves": {\n' + lines + "\n }\n}\n"


# ---- rendering ------------------------------------------------------------------------------------------

def load_records(results: Path = RESULTS) -> list[dict[str, Any]]:
    """Every record under ``results`` (``<entry>/seed<N>.json``), by entry then seed."""
    records = [json.loads(p.read_text()) for p in sorted(results.glob("*/seed*.json"))]
    return sorted(records, key=lambda r: (r["entry"], r["seed"]))


def find_stale(records: list[dict[str, Any]], matrix: dict[str, dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """The records that no longer show what their entry runs, each with the reason: an entry gone from the matrix,
    another config file, or an entry (config file, defaults, args) that now resolves to another config than the
    record's hash. Args that resolve to the same config (a key now spelt out that was a default) keep a record
    current. Their figures are not shown: a figure comes from a run of the current config."""
    stale = []
    for r in records:
        entry = matrix.get(r["entry"])
        if entry is None:
            stale.append((r, "its entry is no longer in results/matrix.yaml"))
        elif entry["config"] != r["config"]:
            stale.append((r, f"the entry now runs {entry['config']}"))
        elif config_hash(entry["config"], _overrides(entry, r["seed"])) != r["config_sha256"]:
            stale.append((r, f"{entry['config']} now resolves to another config"))
    return stale


def split(records: list[dict[str, Any]], matrix: dict[str, dict[str, Any]]
          ) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """The current records, each judged against its entry's bar as it is now, and the stale ones with the reason."""
    stale = find_stale(records, matrix)
    gone = {id(r) for r, _ in stale}
    current = [judge(r, entry_bar(matrix[r["entry"]]["config"], _overrides(matrix[r["entry"]], r["seed"])))
               for r in records if id(r) not in gone]
    return current, stale


def page(records: list[dict[str, Any]], matrix: dict[str, dict[str, Any]]) -> str:
    """``docs/results.md`` from ``records``: the current ones in tables, the stale ones named (:func:`split`)."""
    current, stale = split(records, matrix)
    return render(current, matrix, stale)


def _overrides(entry: dict[str, Any], seed: int) -> list[str]:
    return [f"seed={seed}", *entry.get("args", [])]


def _args(name: str, matrix: dict[str, dict[str, Any]], record: dict[str, Any]) -> list[str]:
    """The overrides an entry runs with: the matrix's (a current record may spell them otherwise), else the record's."""
    return matrix[name].get("args", []) if name in matrix else record["args"]


def _acc(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _bar_text(bar: dict[str, Any] | None) -> str:
    return bar["text"] if bar else "-"


def _machine_text(machine: dict[str, Any]) -> str:
    speed = f", {machine['matmul_gflops']:g} GFLOP/s" if "matmul_gflops" in machine else ""
    return f"{machine['cores']} cores, {machine['cpu']}{speed}"


def entry_table(records: list[dict[str, Any]]) -> list[str]:
    """One entry's runs: a row per seed, then how many met the bar."""
    lines = ["| seed | SFT acc | RL acc | gain | RL min | wall min | bar met | commit | machine |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        met = "-" if "bar" not in r else ("yes" if r["bar"]["passed"] else "**no**")
        if "error" in r:
            met = f"failed (exit {r['returncode']})"
        lines.append(f"| {r['seed']} | {_acc(r.get('sft_acc'))} | {_acc(r.get('rl_acc'))} | "
                     f"{'-' if 'gain' not in r else format(r['gain'], '+.3f')} | {r.get('rl_minutes', '-')} | "
                     f"{r['wall_minutes']} | {met} | `{r['commit'][:7]}{'+dirty' if r['commit'].endswith('+dirty') else ''}` | "
                     f"{_machine_text(r['machine'])} |")
    passed = sum(1 for r in records if r.get("bar", {}).get("passed"))
    lines += ["", f"Bar ({_bar_text(records[0].get('bar'))}): met on {passed} of {len(records)} seeds."]
    return lines


def _per_seed(records: list[dict[str, Any]], seeds: list[int]) -> tuple[list[str], int]:
    """An entry's RL accuracy per seed (blank where it has no run) and how many of its runs met the bar."""
    by_seed = {r["seed"]: r for r in records}
    cells = [_acc(by_seed[s].get("rl_acc")) if s in by_seed else "" for s in seeds]
    return cells, sum(1 for r in records if r.get("bar", {}).get("passed"))


def group_table(entries: dict[str, list[dict[str, Any]]], matrix: dict[str, dict[str, Any]]) -> list[str]:
    """The entries of one group side by side: a row per entry, the RL accuracy per seed, the seeds that met the bar."""
    seeds = sorted({r["seed"] for records in entries.values() for r in records})
    lines = ["| variant | args | " + " | ".join(f"seed {s}" for s in seeds) + " | bar met |",
             "|---|---|" + "---|" * len(seeds) + "---|"]
    for name, records in entries.items():
        cells, passed = _per_seed(records, seeds)
        args = " ".join(f"`{a}`" for a in _args(name, matrix, records[0])) or "(the config as shipped)"
        lines.append(f"| {name} | {args} | " + " | ".join(cells) + f" | {passed} of {len(records)} |")
    return lines


def demos_table(entries: dict[str, list[dict[str, Any]]], matrix: dict[str, dict[str, Any]]) -> list[str]:
    """The shipped demos (entries with ``demo: true``), a row each: its run, its bar, the RL accuracy per seed and
    how many seeds met the bar, so a demo that misses its bar shows here with its numbers."""
    seeds = sorted({r["seed"] for records in entries.values() for r in records})
    lines = ["| entry | run | bar | " + " | ".join(f"seed {s}" for s in seeds) + " | bar met |",
             "|---|---|---|" + "---|" * len(seeds) + "---|"]
    for name, records in entries.items():
        cells, passed = _per_seed(records, seeds)
        run = " ".join([f"`{records[0]['config']}`", *(f"`{a}`" for a in _args(name, matrix, records[0]))])
        met = f"{passed} of {len(records)}" if passed == len(records) else f"**{passed} of {len(records)}**"
        lines.append(f"| [{name}](#{_anchor(records[0].get('title', name))}) | {run} | {_bar_text(records[0].get('bar'))} | "
                     + " | ".join(cells) + f" | {met} |")
    return lines


def _anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def repeats(records: list[dict[str, Any]]) -> list[str]:
    """Runs of one config hash and seed side by side: their accuracies, and the first RL step at which any of their
    curves differ (none: the runs repeated each other exactly)."""
    same: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in records:
        same.setdefault((r["config_sha256"], r["seed"]), []).append(r)
    lines = ["## Repeats", "",
             "Records of the same resolved config (its hash) and seed, run apart, and the first RL step at which their "
             "logged curves (score, entropy, val accuracy) differ. A run on one machine does not always repeat "
             "itself exactly, even with nothing else running: the colour demo's seed 0 at commit 5191c0a, run "
             "twice on an idle 2-core Xeon, logged full-precision MLflow metrics identical up to step 44, then "
             "parted in the 8th digit of the update's loss (runs at four later commits parted from the first "
             "between steps 45 and 104; the two that ran to the end reached 0.998 as it did). A run that shares "
             "the CPU with other work parts sooner. A likely cause is MKL, whose float kernels may take another "
             "path with another memory alignment: with MKL_CBWR=AUTO,STRICT set, two runs of that demo logged "
             "identical full-precision metrics through step 112 (where they were stopped). That setting rounds "
             "differently from step 1, so it is not the default: every record here was run without it. "
             "Between machines a run need not repeat: the float kernels torch and MKL pick for a CPU (its vector "
             "units) round differently, the first update differs in its last bits, and within a few steps the "
             "sampler draws other rollouts; the machine column says where each run ran.", "",
             "| config hash | seed | runs | SFT acc | RL acc | curves | machines |", "|---|---|---|---|---|---|---|"]
    for (digest, seed), runs in sorted(same.items()):
        if len(runs) < 2:
            continue
        step = first_difference([r.get("curves", {}) for r in runs])
        machines = {f"{r['machine']['cores']} cores, {r['machine']['cpu']}" for r in runs}
        lines.append(f"| `{digest}` | {seed} | {', '.join(r['entry'] for r in runs)} | "
                     f"{' / '.join(_acc(r.get('sft_acc')) for r in runs)} | "
                     f"{' / '.join(_acc(r.get('rl_acc')) for r in runs)} | "
                     f"{'identical' if step is None else f'**apart from step {step}**'} | {'; '.join(sorted(machines))} |")
    return lines


def first_difference(curves: list[dict[str, list[list[float]]]]) -> int | None:
    """The first step at which the runs' curves (``name -> [[step, value], ...]`` each) disagree: a value differs,
    or one run logged a point the other did not. None when they agree everywhere."""
    steps = []
    for name in sorted({n for c in curves for n in c}):
        series = [dict((int(p[0]), p[1]) for p in c.get(name, [])) for c in curves]
        for step in sorted({s for points in series for s in points}):
            if len({points.get(step) for points in series}) > 1:
                steps.append(step)
                break
    return min(steps) if steps else None


def render(records: list[dict[str, Any]], matrix: dict[str, dict[str, Any]],
           stale: list[tuple[dict[str, Any], str]] = ()) -> str:
    """``docs/results.md``: per entry (in the matrix's order, then any other recorded), its table and curve; a
    group's entries also side by side; the ``stale`` records (record, reason) named without their figures."""
    by_entry: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_entry.setdefault(r["entry"], []).append(r)
    order = [n for n in matrix if n in by_entry] + sorted(n for n in by_entry if n not in matrix)
    lines = ["# Results", "",
             "Generated by `make results` from the records under `results/` (one JSON per run: commit, config and its "
             "hash, command, seed, accuracies, times, MLflow run id, curves, machine). Do not edit: rerun "
             "`make results ONLY=<entry> SEEDS=<seeds>`, or `python -m pipelines.results --render`. Accuracies are "
             "greedy, on each demo's test split; times are the demo's own (2 CPU cores unless the machine column "
             "says otherwise; where it gives GFLOP/s, that is a float32 matmul's speed measured as the run started: "
             "hosts of one CPU model differ from day to day, and a run's minutes move with it).", ""]
    groups: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name in order:
        group = by_entry[name][0].get("group", "")
        if group:
            groups.setdefault(group, {})[name] = by_entry[name]
    demos = {name: by_entry[name] for name in order if matrix.get(name, {}).get("demo")}
    if demos:
        lines += ["## Each demo against its bar", "", *demos_table(demos, matrix), ""]
    for group, entries in groups.items():
        lines += [f"## {group}", "", *group_table(entries, matrix), ""]
    missing = [n for n in matrix if n not in by_entry]
    if missing:
        lines += ["## Not measured", "",
                  "Entries of the matrix with no record of their current config (their configs state a bar; no figure "
                  "is shown until `make results ONLY=<entry>` has run them): " + ", ".join(f"`{n}` ({matrix[n]['config']})"
                                                                             for n in missing) + ".", ""]
    if stale:
        lines += ["## Stale records", "",
                  "Records that no longer show what their entry runs (not shown above, no figure of theirs is quoted): "
                  "rerun them with `make results ONLY=<entry> SEEDS=<seed>`, or delete them.", "",
                  "| entry | seed | commit | why |", "|---|---|---|---|",
                  *(f"| {r['entry']} | {r['seed']} | `{r['commit'][:7]}` | {why} |" for r, why in stale), ""]
    lines += [*repeats(records), ""]
    for name in order:
        records_ = by_entry[name]
        first = records_[0]
        args = " ".join(_args(name, matrix, first))
        lines += [f"## {first.get('title', name)}", "",
                  f"`make results ONLY={name}`: `make demo CONFIG={first['config']}"
                  f"{' ARGS=' + chr(34) + args + chr(34) if args else ''}` per seed.", "",
                  *([matrix[name]["note"].strip(), ""] if matrix.get(name, {}).get("note") else []),
                  *entry_table(records_), "", f"![val accuracy, {name}](results/{name}.png)", ""]
    return "\n".join(lines).rstrip() + "\n"


def plot(records: list[dict[str, Any]], out_dir: Path) -> None:
    """``<out_dir>/<entry>.png``: validation accuracy against the RL step, a line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_entry: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_entry.setdefault(r["entry"], []).append(r)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, runs in by_entry.items():
        fig, ax = plt.subplots(figsize=(5, 3), dpi=100)
        for r in runs:
            points = r.get("curves", {}).get("val_acc", [])
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=f"seed {r['seed']}")
        ax.set(xlabel="RL step", ylabel="val accuracy", ylim=(0, 1.02), title=name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / f"{name}.png", metadata={"Software": None})
        plt.close(fig)
    for old in out_dir.glob("*.png"):  # the curve of an entry with no current record goes with its figures
        if old.stem not in by_entry:
            old.unlink()


def write_docs(matrix: dict[str, dict[str, Any]]) -> None:
    records = load_records()
    DOC.parent.mkdir(parents=True, exist_ok=True)
    current, stale = split(records, matrix)
    DOC.write_text(render(current, matrix, stale))
    plot(current, DOC.parent / "results")
    print(f"results: {len(records)} records -> {DOC.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, help="comma-separated entries of the matrix (default: all)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: each entry's)")
    parser.add_argument("--render", action="store_true", help="only render docs/results.md from the records")
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/results.md is not the records'")
    args = parser.parse_args(argv)
    matrix = load_matrix()
    if args.check:
        stale = not DOC.exists() or DOC.read_text() != page(load_records(), matrix)
        if stale:
            print(f"{DOC.relative_to(ROOT)} differs from the records under results/: run "
                  "`python -m pipelines.results --render`", file=sys.stderr)
        return int(stale)
    if not args.render:
        for name, seed in select(matrix, args.only, args.seeds):
            record = run_one(name, matrix[name], seed)
            print(f"results: {name} seed {seed}: rl_acc={_acc(record.get('rl_acc'))} "
                  f"bar {'met' if record.get('bar', {}).get('passed') else 'NOT met'}", flush=True)
    write_docs(matrix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
