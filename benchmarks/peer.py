"""``make bench-peer`` (and the end of ``make bench``): mmrl against TRL's GRPOTrainer on the same work.

The same random-init tiny model, the same 112x112 images and prompts, the same GRPO work (P prompts x n
samples x up to T new tokens, temperature 1, no KL, one PPO epoch, one optimizer step per batch), one process
each side with the same torch threads. mmrl runs at its defaults: its automatic token budgets
(:mod:`mmrl.memory.budget`) put a step's P*n samples in one generation batch and one update micro-batch at these
shapes, which TRL is given too (one generation batch is TRL's own way; ``actor.micro_batch_size`` set in the
config or ARGS sets both sides' training micro-batch instead). A random-init model rarely emits the
end-of-turn token, so nearly every response runs to T tokens on both sides (the mean lengths are printed).

Each side runs ``1 + STEPS`` steps; the first is a warm-up and the table gives the median of the rest, split
into generation, scoring + log-prob passes, and the update. samples/s = P*n / step seconds. TRL is an
optional dependency: ``make bench-peer`` installs it (``make install`` never does).

    python -m benchmarks.peer --config configs/demo.yaml
    python -m benchmarks.peer --config configs/demo.yaml --sizes "16x8x16 64x8x32"  # other sizes
    python -m benchmarks.peer --config configs/demo.yaml --sides "mmrl-64-rows mmrl"  # other sides
    make bench-peer SIZES="16x8x16" SIDES="trl mmrl"                                # the same through make

Sizes (``--sizes``, default ``16x8x16 64x8x32``, each P x n x T). Sides (``--sides``, default ``trl mmrl
mmrl-async``; the ratio column compares each with the first):
``trl``, ``mmrl``, ``mmrl-async`` (``trainer.mode=async``, ``max_staleness=1``: a one-rank rollout pool with one
thread beside the trainer's rank with one thread, where the sync sides compute with all the threads; its
"generate" is the step's wait for rollouts, and the last column gives that wait, the rollout pool's wait for
weights and the mean staleness), ``mmrl-async-partial`` (``mmrl-async`` with in-flight weight updates,
``rollout.partial=true``: a generation running when the trainer publishes new weights goes on with them), and
``mmrl-64-rows``, mmrl at the row-count defaults it had before the token budgets (64 samples per generate call and
per micro-batch). ``make bench-long-tail`` (:mod:`benchmarks.long_tail`) runs the sync and async sides on a workload
whose response lengths vary many-fold.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from mlflow.tracking import MlflowClient

from benchmarks.flags import names, parse_flags, shapes
from mmrl.config import Config
from mmrl.trainer.tracking import tracking_uri

OUT = Path("outputs/bench_peer")
SIZES = ((16, 8, 16), (64, 8, 32))  # prompts x samples x max new tokens; --sizes "2x2x4 8x4x8" overrides
STEPS = 3
SIDES = ("trl", "mmrl", "mmrl-async")
MMRL_SIDES = {
    "mmrl": [],
    "mmrl-64-rows": ["rollout.micro_batch_size=64", "actor.micro_batch_size=64"],
    # One thread for the rollout pool's rank, one for the trainer's: the two overlap on the same cores.
    "mmrl-async": ["trainer.mode=async", "trainer.max_staleness=1", "rollout.num_workers=1",
                   "resources.threads_per_worker=1"],
}
"""The mmrl sides: the overrides each adds to the shared work."""
# In-flight weight updates: a generation running when the trainer publishes goes on with the new weights.
MMRL_SIDES["mmrl-async-partial"] = [*MMRL_SIDES["mmrl-async"], "rollout.partial=true"]


@dataclass
class SideResult:
    """Median seconds per measured step, and per phase."""

    step_s: float
    phases: dict[str, float] = field(default_factory=dict)
    mean_length: float = 0.0
    overlap: dict[str, float] = field(default_factory=dict)
    """The async mode's: the trainer's wait for rollouts, the rollout pool's wait for weights (s), the staleness;
    with ``rollout.partial`` also the response tokens' mean staleness and the share drawn by newer weights than their
    sample's first token."""

    mfu: dict[str, float] = field(default_factory=dict)
    """MFU per phase (:mod:`mmrl.perf`): an mmrl side's ``perf/mfu/*`` medians; TRL's from the same FLOP account
    (an mmrl side's ``perf/tflop/*`` of the same work) over TRL's phase seconds, against that side's peak."""
    tflop: dict[str, float] = field(default_factory=dict)
    peak_tflops: float = 0.0

    def samples_per_s(self, samples: int) -> float:
        return samples / self.step_s


def peer_overrides(prompts: int, n: int, tokens: int, threads: int, out: Path = OUT, steps: int = STEPS) -> list[str]:
    """The mmrl side: GRPO from the random-init model, no KL, on-policy, no evaluation or checkpoints; a warm-up
    step and ``steps`` measured ones, the model, data and runs under ``out``."""
    return [
        f"model.path={out / 'model'}", f"data.dir={out / 'data'}", f"trainer.init={out / 'model'}",
        f"trainer.out_dir={out / f'mmrl-{prompts}x{n}x{tokens}'}", "trainer.resume=never",
        f"trainer.steps={1 + steps}", f"trainer.prompts_per_step={prompts}", "trainer.eval_every=0",
        "trainer.save_every=0", "trainer.val_size=8",
        f"rollout.n={n}", f"rollout.max_new_tokens={tokens}", "rollout.temperature=1.0",
        "algorithm.name=grpo", "actor.use_kl_loss=false", "actor.ppo_epochs=1", "actor.num_mini_batches=1",
        "resources.num_workers=1", f"resources.threads_per_worker={threads}",
        f"tracking.uri=sqlite:///{out}/mlflow.db",
    ]


def run_mmrl(cfg: Config) -> SideResult:
    """``run_rl`` on the config; phases from its ``timing_s/*`` metrics (median over the measured steps)."""
    from mmrl.trainer.run import run_rl

    return side_result(cfg, str(run_rl(cfg)["mlflow_run_id"]))


def side_result(cfg: Config, run_id: str) -> SideResult:
    """The run ``run_id``'s median step and phases over its measured steps (its ``timing_s/*`` metrics)."""
    client = MlflowClient(tracking_uri(cfg.tracking))

    def median(metric: str) -> float:
        history = sorted(client.get_metric_history(run_id, metric), key=lambda m: m.step)
        values = [m.value for m in history][1:]  # the first step is the warm-up
        return statistics.median(values) if values else 0.0

    step = median("timing_s/step")
    update = median("timing_s/update_actor")
    overlap = {}
    if cfg.trainer.mode == "async":  # generation runs beside the step: the step sees only its wait for it
        gen = median("timing_s/wait_rollout")
        overlap = {"wait_rollout": gen, "wait_weights": median("timing_s/wait_weights"),
                   "staleness": median("async/staleness_mean")}
        if cfg.rollout.partial:
            overlap |= {"token_staleness": median("async/token_staleness_mean"),
                        "inflight_share": median("async/inflight_token_share")}
    else:
        gen = median("timing_s/gen")
    phases = {name.removeprefix("perf/mfu/") for name in client.get_run(run_id).data.metrics
              if name.startswith("perf/mfu/")}
    peaks = client.get_metric_history(run_id, "perf/peak_tflops")
    return SideResult(step, {"generate": gen, "score+log-probs": step - gen - update, "update": update},
                      median("response_length/mean"), overlap,
                      mfu={p: median(f"perf/mfu/{p}") for p in sorted(phases)},
                      tflop={p: median(f"perf/tflop/{p}") for p in sorted(phases)},
                      peak_tflops=peaks[0].value if peaks else 0.0)


def peer_mfu(trl: SideResult, mmrl: SideResult) -> dict[str, float]:
    """TRL's MFU of generation and the update: the FLOPs of the same work as mmrl's account counts them, over
    TRL's seconds, against the peak mmrl's run measured on the same machine and threads."""
    peak = mmrl.peak_tflops
    pairs = {"gen": "generate", "update_actor": "update"}
    return {phase: mmrl.tflop[phase] / trl.phases[ours] / peak for phase, ours in pairs.items()
            if phase in mmrl.tflop and trl.phases[ours] > 0 and peak > 0}


def trl_dataset(rows: list[dict[str, Any]]) -> Any:
    """TRL's conversational format: ``prompt`` (messages with image items), ``image``, ``answer``."""
    from datasets import Dataset
    from PIL import Image

    from mmrl.models.encoding import to_chat_content

    records = []
    for row in rows:
        if len(row["images"]) != 1:
            raise ValueError(f"bench-peer: row {row['id']} has {len(row['images'])} images; the peer run uses one")
        records.append({"prompt": to_chat_content(row["messages"]), "answer": row["answer"],
                        "image": Image.open(io.BytesIO(row["images"][0])).convert("RGB")})
    return Dataset.from_list(records)


def run_trl(cfg: Config, prompts: int, n: int, tokens: int, threads: int) -> SideResult:
    """TRL's GRPOTrainer on the same model, data and work; phases timed by wrapping its methods."""
    try:
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as err:
        raise SystemExit("bench-peer: TRL is not installed; `make bench-peer` installs it (pip install trl)") from err
    from transformers import AutoProcessor, TrainerCallback

    from mmrl.models.encoding import vision_token_ids
    from mmrl.models.loading import load_model
    from mmrl.trainer.dataset import load_rows
    from rewards import answer_match

    torch.set_num_threads(threads)
    processor = AutoProcessor.from_pretrained(cfg.model.path)
    model = load_model(cfg.model.path, "float32", cfg.model.attn_implementation, torch.device("cpu"))
    rows = load_rows(cfg.data.dir, "train", limit=prompts * (1 + STEPS))
    timing: dict[str, list[float]] = {"generate": [], "generate_and_score": [], "step": [], "length": []}

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [answer_match(t, a) for t, a in zip(texts, answer)]

    class Timed(GRPOTrainer):
        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = super()._generate(*args, **kwargs)
            timing["generate"].append(time.perf_counter() - start)
            return out

        def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = super()._generate_and_score_completions(*args, **kwargs)
            timing["generate_and_score"].append(time.perf_counter() - start)
            timing["length"].append(float(out["completion_mask"].sum(1).float().mean()))
            return out

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            timing["step"].append(time.perf_counter() - self.start)

    micro = min(cfg.actor.micro_batch_size or prompts * n, prompts * n)  # 0 (auto): one, as mmrl's budget gives
    args = GRPOConfig(
        output_dir=str(OUT / f"trl-{prompts}x{n}x{tokens}"), use_cpu=True, report_to=[], save_strategy="no",
        logging_steps=1000, max_steps=1 + STEPS, learning_rate=cfg.actor.lr, seed=cfg.seed,
        per_device_train_batch_size=micro, gradient_accumulation_steps=prompts * n // micro,
        num_generations=n, max_completion_length=tokens, temperature=1.0, beta=0.0, num_iterations=1,
        remove_unused_columns=False, dataloader_num_workers=0, bf16=False, disable_tqdm=True,
        generation_kwargs={"suppress_tokens": vision_token_ids(processor)},
    )
    trainer = Timed(model=model, reward_funcs=[reward], args=args, train_dataset=trl_dataset(rows),
                    processing_class=processor, callbacks=[StepTimer()])
    trainer.train()
    if len(timing["step"]) < 2:
        raise RuntimeError(f"bench-peer: TRL ran {len(timing['step'])} steps, expected {1 + STEPS}")
    step = statistics.median(timing["step"][1:])
    gen = statistics.median(timing["generate"][1:])
    scored = statistics.median(timing["generate_and_score"][1:])
    return SideResult(step, {"generate": gen, "score+log-probs": scored - gen, "update": step - scored},
                      statistics.median(timing["length"][1:]))


Result = tuple[tuple[int, int, int], dict[str, SideResult]]


def print_rows(results: list[Result]) -> None:
    header = ["work (P x n x T)", "side", "samples/s", "step s", "generate s", "score+log-probs s", "update s",
              "mean length", "vs first", "async: wait rollout s / wait weights s / staleness"]
    rows = []
    for (p, n, t), sides in results:
        first = next(iter(sides.values()))
        for index, (name, side) in enumerate(sides.items()):
            ratio = side.samples_per_s(p * n) / first.samples_per_s(p * n)
            rows.append([f"{p}x{n}x{t}", name, f"{side.samples_per_s(p * n):.1f}", f"{side.step_s:.3f}",
                         *(f"{side.phases[k]:.3f}" for k in ("generate", "score+log-probs", "update")),
                         f"{side.mean_length:.1f}", f"{ratio:.2f}x" if index else "",
                         " / ".join(f"{side.overlap[k]:.3f}" if k != "staleness" else f"{side.overlap[k]:.2f}"
                                    for k in ("wait_rollout", "wait_weights", "staleness")) if side.overlap else ""])
    print(f"\nGRPO step, {' vs '.join(results[0][1])}, same model and work; median of {STEPS} steps after a warm-up")
    print_table(header, rows)
    print_mfu(results)


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


def print_mfu(results: list[Result]) -> None:
    """MFU per phase of each side, against the matmul peak its run measured (:mod:`mmrl.perf`)."""
    phases = sorted({p for _, sides in results for side in sides.values() for p in side.mfu})
    if not phases:
        return
    rows = []
    for (p, n, t), sides in results:
        for name, side in sides.items():
            cells = [f"{side.mfu[k]:.2%}" if k in side.mfu else "-" for k in phases]
            rows.append([f"{p}x{n}x{t}", name, f"{side.peak_tflops * 1e3:.1f}", *cells])
    print("\nMFU per phase (FLOPs of the work's math / phase seconds / the matmul peak measured in the run)")
    print_table(["work (P x n x T)", "side", "peak GFLOP/s", *phases], rows)


def flag_parser() -> argparse.ArgumentParser:
    """The flags of ``make bench-peer``: the sizes and the sides."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=shapes(3, "16x8x16 64x8x32"), default=" ".join(map(shape_text, SIZES)),
                        help="the work, each P x n x T (prompts x samples x max new tokens), separated by spaces "
                             "or commas (make: SIZES=...; default: %(default)s)")
    parser.add_argument("--sides", type=names(["trl", *MMRL_SIDES]), default=" ".join(SIDES),
                        help=f"the sides, the first the ratios' base, from {', '.join(['trl', *MMRL_SIDES])} "
                             "(make: SIDES=...; default: %(default)s)")
    return parser


def shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def main(argv: list[str] | None = None) -> list[Result]:
    from benchmarks.common import ensure_inputs

    command, flags = parse_flags(flag_parser(), argv)
    sizes, sides = flags.sizes, flags.sides
    threads = command.load().resources.threads_per_worker or torch.get_num_threads()
    train = max(p for p, _, _ in sizes) * (1 + STEPS)
    data_sizes = f"data.sizes={{sft: 8, train: {train}, val: 8, test: 8}}"
    ensure_inputs(command.load(*peer_overrides(*sizes[0], threads), data_sizes), rebuild_data=True)  # sized by the work
    results: list[Result] = []
    for prompts, n, tokens in sizes:
        work = [*peer_overrides(prompts, n, tokens, threads), data_sizes]
        measured = {}
        for side in sides:
            if side == "trl":
                measured["TRL"] = run_trl(command.load(*work), prompts, n, tokens, threads)
            else:
                out_dir = f"trainer.out_dir={OUT / f'{side}-{prompts}x{n}x{tokens}'}"
                measured[side] = run_mmrl(command.load(*work, out_dir, *MMRL_SIDES[side]))
        ours = next((side for name, side in measured.items() if name != "TRL"), None)
        if "TRL" in measured and ours is not None:
            measured["TRL"].mfu, measured["TRL"].peak_tflops = peer_mfu(measured["TRL"], ours), ours.peak_tflops
        results.append(((prompts, n, tokens), measured))
        print_rows(results)
    return results


if __name__ == "__main__":
    main()
