"""What the benchmarks share: the bench model and data, a probed worker group, one full RL step, a table."""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.probes import ProbedActor
from mmrl.config import Config
from mmrl.controller import ResourcePool, WorkerGroup
from mmrl.controller.worker import resolve_device
from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams


def step_peaks(group: WorkerGroup, peaks: list[float]) -> list[float]:
    """Each worker's peak so far: ``peaks`` and the window of the step just run, whichever is larger."""
    return [max(a, b) for a, b in zip(peaks, group.peak_memory_gb())]


def ensure_inputs(cfg: Config, rebuild_data: bool = False) -> None:
    """Build the bench model and data the first time (seconds); the data every time with ``rebuild_data``."""
    from data_prep.parquet import write_parquet
    from data_prep.synthetic import build_splits
    from mmrl.models.tiny import build_tiny_vlm
    from pipelines.model import task_corpus

    if not (Path(cfg.model.path) / "config.json").is_file():
        build_tiny_vlm(task_corpus(cfg), cfg.tiny_model, cfg.model.path, cfg.seed, cfg.model.family)
    if rebuild_data or not (Path(cfg.data.dir) / "train.parquet").is_file():
        splits = build_splits(cfg.data.tasks, cfg.data.sizes, cfg.seed, cfg.data.image_size, cfg.data.max_count)
        for split, rows in splits.items():
            write_parquet(rows, Path(cfg.data.dir) / f"{split}.parquet")


def spawn(cfg: Config) -> WorkerGroup:
    use_gpu = resolve_device(cfg.resources.device).type == "cuda"
    workers = cfg.resources.num_workers
    cpus = float(torch.get_num_threads()) if not use_gpu else 1.0
    pool = ResourcePool(workers, cpus_per_worker=max(cpus / workers, 0.5), use_gpu=use_gpu, name="bench")
    return WorkerGroup(ProbedActor, pool, threads=max(1, int(cpus // workers)), device=cfg.resources.device)


def full_step(group: WorkerGroup, prompts: Batch, params: SamplingParams) -> Batch:
    """A new step (its peak-memory window opens) -> rollout -> old and reference log-probs -> advantages (random: this measures the system) -> update -> the
    weights into the engine. With ``group.group_by_prompt`` off (the baseline of :func:`benchmarks.layouts.data_movement`), the
    driver holds the prompts' encodings, as before prompts stayed on the workers, and ships them each call."""
    group.forget_prompts()
    baseline = not group.group_by_prompt
    batch = prompts.repeat(params.n).union(group.generate(prompts, params, return_prompts=baseline))
    batch = batch.union(group.compute_log_probs(batch)).union(group.compute_ref_log_probs(batch))
    batch.tensors["advantages"] = torch.randn(len(batch), 1) * batch["response_mask"]
    group.update_actor(batch)
    group.sync_weights(False)
    return batch


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """``title``, then the rows under ``header`` in left-aligned columns."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
