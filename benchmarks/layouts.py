"""``make bench`` (first part, after ``bench-peer``): step time and peak memory of the worker layouts.

Runs, each in fresh worker processes (so that every peak is its own):

1. one full GRPO-style step (rollout -> old and reference log-probs -> update) for N=1 and N=2 workers and
   every vision/llm strategy combination, timed over a few steps after a warm-up;
2. the peak memory of actor + rollout + reference against the actor alone (log-probs + update only);
3. the data one step moves between the driver and 1 or 2 workers, both ways, and the vision tower's work:
   before (the driver holds the prompts' encodings and ships them to every call) against after (prompts stay
   on the rank that encoded them).

Peak memory is the trainer's ``perf/max_memory_gb`` measurement (:mod:`mmrl.memory.peaks`: the peak RSS on
CPU, CUDA's peak allocated memory on GPU), in GiB: each step opens a window on every worker (as a training
step does), and a worker's peak is the largest of its steps' (so loading's transient full copies, before
sharding, never count). ``perf/max_memory_gb`` is the largest over the workers, as the trainer logs it;
"all" sums the workers.

Ratios are against the first row of each table, measured in the same command. This is a benchmark, not
a test: it asserts nothing about speed.

    make bench                                   # configs/bench.yaml (an ~11 M parameter tiny model)
    make bench ARGS="trainer.prompts_per_step=16"  # any config key
    python -m benchmarks.layouts --config configs/bench.yaml
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from benchmarks.common import ensure_inputs, full_step, print_table, spawn, step_peaks
from mmrl.config import Config, PartConfig, VisionPartConfig
from mmrl.controller.session import ensure_ray
from mmrl.memory.peaks import PEAK_KEY
from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams
from mmrl.trainer.dataset import PromptLoader, load_rows
from pipelines.cli import parse

STEPS = 4
LAYOUTS = [  # (workers, vision, llm)
    (1, "replicate", "replicate"),
    (2, "replicate", "replicate"),
    (2, "fsdp", "replicate"),
    (2, "replicate", "fsdp"),
    (2, "fsdp", "fsdp"),
    (2, "hsdp", "hsdp"),
]
MEMORY = [(1, "replicate", "replicate"), (2, "fsdp", "fsdp")]


@dataclass
class Result:
    step_s: float
    start_gb: list[float]
    """Each worker's live memory before the measured steps."""
    peak_gb: list[float]
    """Each worker's peak over the measured steps."""

    @property
    def total_gb(self) -> float:
        return sum(self.peak_gb)

    @property
    def growth_gb(self) -> float:
        """What the measured steps added on top of the live memory they started from, all workers."""
        return sum(self.peak_gb) - sum(self.start_gb)


def variant(cfg: Config, workers: int, vision: str, llm: str) -> Config:
    cfg = copy.deepcopy(cfg)
    cfg.resources.num_workers = workers
    cfg.actor.vision = VisionPartConfig(strategy=vision, shard_size=1, freeze=cfg.actor.vision.freeze)
    cfg.actor.llm = PartConfig(strategy=llm, shard_size=1)
    return cfg


def time_layout(cfg: Config, prompts: list[Batch], params: SamplingParams) -> Result:
    group = spawn(cfg)
    try:
        group.init_model(cfg, cfg.model.path, True)
        full_step(group, prompts[0], params)  # warm-up
        start_gb, peaks = group.reset_peak_memory(), [0.0] * group.world_size
        times = []
        for batch in prompts[1:]:
            start = time.perf_counter()
            full_step(group, batch, params)
            times.append(time.perf_counter() - start)
            peaks = step_peaks(group, peaks)
        return Result(statistics.median(times), start_gb, peaks)
    finally:
        group.shutdown()


def memory_of(cfg: Config, batch: Batch, prompts: Batch, params: SamplingParams, hybrid: bool) -> Result:
    """Peak memory of one step: the hybrid worker (rollout + reference + actor) or the actor alone."""
    cfg = copy.deepcopy(cfg)
    cfg.actor.use_kl_loss = hybrid  # the actor alone has no reference to be anchored to
    group = spawn(cfg)
    try:
        group.init_model(cfg, cfg.model.path, hybrid, hybrid)
        start_gb = group.reset_peak_memory()
        start = time.perf_counter()
        if hybrid:
            full_step(group, prompts, params)
        else:
            trainable = batch.union(group.compute_log_probs(batch))
            group.update_actor(trainable)
        return Result(time.perf_counter() - start, start_gb, group.peak_memory_gb())
    finally:
        group.shutdown()


def data_movement(cfg: Config, prompts: Batch, params: SamplingParams) -> list[list[str]]:
    """What one full step moves between the driver and 1 or 2 workers, before (the driver holds the prompts'
    encodings and ships them to every call; a prompt's samples are scattered over the ranks by tokens) and
    after (each prompt's samples stay on the rank that encoded it; later calls send uids): KiB of pickled call
    arguments sent, KiB of results received, and the images and videos the vision tower encoded (rollout, the
    two log-prob passes and the update together)."""
    rows = []
    for workers in (1, 2):
        group = spawn(variant(cfg, workers, "replicate", "replicate"))
        try:
            group.init_model(cfg, cfg.model.path, True)
            group.count_bytes = True
            for after in (False, True):
                group.group_by_prompt = after
                group.bytes_sent.clear()
                group.bytes_received.clear()
                group.vision_passes()
                torch.manual_seed(0)
                full_step(group, prompts, params)
                sent, received = sum(group.bytes_sent.values()), sum(group.bytes_received.values())
                rows.append([str(workers), "after" if after else "before", f"{sent / 1024:.1f}",
                             f"{received / 1024:.1f}", str(sum(group.vision_passes()))])
        finally:
            group.shutdown()
    for pair in (rows[:2], rows[2:]):
        before, after = pair
        after.append(f"{float(before[2]) / float(after[2]):.0f}x / {float(before[3]) / float(after[3]):.0f}x")
        before.append("")
    return rows


def main(argv: list[str] | None = None) -> None:
    cfg = parse(__doc__, argv)
    ensure_inputs(cfg)
    ensure_ray(cfg.resources)
    params = SamplingParams(n=cfg.rollout.n, temperature=cfg.rollout.temperature,
                            max_new_tokens=cfg.rollout.max_new_tokens)
    loader = iter(PromptLoader(load_rows(cfg.data.dir, "train"), cfg.trainer.prompts_per_step, cfg.seed))
    prompts = [next(loader) for _ in range(STEPS + 1)]

    timed = {}
    for layout in tqdm(LAYOUTS, desc="layouts (full steps)"):
        timed[layout] = time_layout(variant(cfg, *layout), prompts, params)
    base = timed[LAYOUTS[0]]
    rows = [[str(n), v, l, f"{r.step_s:.3f}", f"{r.step_s / base.step_s:.2f}x", f"{sum(r.start_gb):.3f}",
             f"{r.total_gb:.3f}", f"{max(r.peak_gb):.3f}", f"{r.growth_gb:+.3f}"] for (n, v, l), r in timed.items()]
    print_table(f"One RL step (rollout + old/ref log-probs + update), {len(prompts[0])} prompts x {params.n}, "
                f"median of {STEPS} after a warm-up; peak memory (GiB) over those steps",
                ["N", "vision", "llm", "step s", "vs N=1", "live GiB (all)", "peak (all)", PEAK_KEY,
                 "step growth"], rows)

    # A fixed batch for the actor-alone runs: one rollout from the first hybrid run.
    sample_group = spawn(variant(cfg, 1, "replicate", "replicate"))
    sample_group.init_model(cfg, cfg.model.path, False)
    batch = prompts[0].repeat(params.n).union(sample_group.generate(prompts[0], params))
    batch.tensors["advantages"] = torch.randn(len(batch), 1) * batch["response_mask"]
    sample_group.shutdown()
    rows = []
    for layout in tqdm(MEMORY, desc="memory (actor alone vs hybrid)"):
        alone = memory_of(variant(cfg, *layout), batch, prompts[0], params, hybrid=False)
        hybrid = memory_of(variant(cfg, *layout), batch, prompts[0], params, hybrid=True)
        n, v, l = layout
        rows.append([str(n), v, l, f"{max(alone.peak_gb):.3f}", f"{alone.total_gb:.3f}", f"{alone.growth_gb:+.3f}",
                     f"{max(hybrid.peak_gb):.3f}", f"{hybrid.total_gb:.3f}", f"{hybrid.growth_gb:+.3f}",
                     f"{hybrid.total_gb / alone.total_gb:.2f}x"])
    print_table("Peak memory of one step (GiB): actor alone (log-probs + update) vs actor + rollout + reference; "
                f"{PEAK_KEY} = the largest worker's, all = summed over the workers, growth = the peak minus the live "
                "memory the step started from",
                ["N", "vision", "llm", f"actor {PEAK_KEY}", "actor all", "actor growth", f"hybrid {PEAK_KEY}",
                 "hybrid all", "hybrid growth", "ratio (all)"], rows)

    first = prompts[0].objects
    images = sum(len(i) + len(v) for i, v in zip(first["images"], first.get("videos", [[]] * len(prompts[0]))))
    print_table(f"Data moved in one step ({len(prompts[0])} prompts x {params.n}, {images} images and videos): "
                "pickled KiB driver -> workers and back, and the items the vision tower encoded (rollout + old "
                "and reference log-probs + update); before = encodings held by the driver, samples scattered",
                ["N", "dispatch", "KiB sent", "KiB received", "vision items", "before/after: sent / received"],
                data_movement(cfg, prompts[0], params))


if __name__ == "__main__":
    main()
