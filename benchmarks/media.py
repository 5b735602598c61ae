"""``make bench`` (third part): video data prep throughput, and an RL step on images against video.

1. Data prep: synthetic clips (4 frames of 112x112, as MP4) and longer user-like clips (10 s of 224x224 at
   30 fps, sampled down to ``data.video_max_frames``) through the converter: videos/s and frames/s
   decoded, sampled and stored (decord in its child process, PNG frames).
2. One full RL step (rollout, old and reference log-probs, update), 1 worker, on the demo's model: the
   image task (one 112x112 image per prompt) against the video task (4 frames of 112x112 per prompt),
   median of 3 after a warm-up. Ratios are video over image, measured in the same command.

    python -m benchmarks.media --config configs/bench_engines.yaml
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import ensure_inputs, full_step, print_table, spawn
from data_prep.convert import convert_jsonl
from data_prep.synthetic import VideoSynthesis, build_splits
from data_prep.synthetic_video import ClipSpec, write_mp4
from mmrl.config import Config
from mmrl.controller.session import ensure_ray
from mmrl.rollout.base import SamplingParams
from mmrl.trainer.dataset import PromptLoader
from pipelines.cli import parse
from pipelines.data import video_limits

RUNS = 3


def prep_throughput(cfg: Config, folder: Path, kind: str, count: int) -> list[str]:
    """Convert ``count`` clips of ``kind`` (synthetic | long): a table row of videos/s and frames/s."""
    media = folder / kind
    lines = []
    rng = np.random.default_rng(0)
    for i in range(count):
        frames, fps, size = (4, 2.0, 112) if kind == "synthetic" else (300, 30.0, 224)
        arrays = [np.full((size, size, 3), rng.integers(0, 255), np.uint8) for _ in range(frames)]
        write_mp4(arrays, media / f"{i}.mp4", fps)
        lines.append(json.dumps({"prompt": "<video>What happens?", "video": f"{i}.mp4", "answer": "x"}))
    (folder / f"{kind}.jsonl").write_text("\n".join(lines) + "\n")
    start = time.perf_counter()
    report = convert_jsonl(folder / f"{kind}.jsonl", media, folder / f"{kind}.parquet", folder / f"{kind}.q.jsonl",
                           min_pixels=cfg.data.min_pixels, max_pixels=cfg.data.max_pixels,
                           video_limits=video_limits(cfg, 28))
    seconds = time.perf_counter() - start
    stored = 4 if kind == "synthetic" else cfg.data.video_max_frames
    assert report.num_written == count, report.summary()
    label = "4 x 112x112 @2fps" if kind == "synthetic" else f"10 s 224x224 @30fps -> {stored} frames"
    return [label, str(count), f"{count / seconds:.1f}", f"{count * stored / seconds:.0f}"]


def step_time(cfg: Config, prompts: list, params: SamplingParams) -> float:
    group = spawn(cfg)
    try:
        group.init_model(cfg, cfg.model.path, True)
        full_step(group, prompts[0], params)  # warm-up
        times = []
        for batch in prompts[1:]:
            start = time.perf_counter()
            full_step(group, batch, params)
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        group.shutdown()


def main(argv: list[str] | None = None) -> None:
    cfg = parse(__doc__, argv)
    ensure_inputs(cfg)
    ensure_ray(cfg.resources)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [prep_throughput(cfg, Path(tmp), "synthetic", 200), prep_throughput(cfg, Path(tmp), "long", 20)]
    print_table("Video data prep (decode, sample, size, store as PNG frames)",
                ["clips", "videos", "videos/s", "frames/s"], rows)

    params = SamplingParams(n=cfg.rollout.n, temperature=cfg.rollout.temperature,
                            max_new_tokens=cfg.rollout.max_new_tokens)
    size = cfg.trainer.prompts_per_step
    times = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in ("colour", "first_colour"):
            splits = build_splits({task: 1.0}, {"train": size * (RUNS + 1)}, cfg.seed, image_size=112,
                                  video=VideoSynthesis(Path(tmp) / "media", ClipSpec(size=112, frames=4)))
            loader = PromptLoader(splits["train"], size, cfg.seed)
            torch.manual_seed(0)
            times[task] = step_time(cfg, [loader.next_batch() for _ in range(RUNS + 1)], params)
    print_table(f"One RL step, {size} prompts x {params.n}, 1 worker, median of {RUNS}",
                ["task", "media per prompt", "step s", "vs image"],
                [["colour", "1 image 112x112", f"{times['colour']:.3f}", "1.00x"],
                 ["first_colour", "4 frames 112x112", f"{times['first_colour']:.3f}",
                  f"{times['first_colour'] / times['colour']:.2f}x"]])


if __name__ == "__main__":
    main()
