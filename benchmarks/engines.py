"""``make bench`` (second part): rollout throughput of the ``hf`` and ``vllm`` engines, side by side.

On the demo's tiny model (configs/bench_engines.yaml, built on first use), one worker each: samples/s and
generated tokens/s of ``generate`` at 8, 64 and 256 prompts x ``rollout.n`` (8) with the demo's
``max_new_tokens``, the median of 3 runs after a warm-up (the weights are unchanged, so no run loads them
into the engine); and the time of one weight load alone. Ratios are vLLM over hf, measured in the same
command. The demo's default engine is the faster one at the demo's size (16 prompts x 8): the README gives
the table.

    make bench                                     # every part
    python -m benchmarks.engines --config configs/bench_engines.yaml
"""

from __future__ import annotations

import copy
import statistics
import time

from tqdm import tqdm

from benchmarks.common import ensure_inputs, print_table, spawn
from mmrl.config import Config
from mmrl.controller.session import ensure_ray
from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams
from mmrl.trainer.dataset import PromptLoader, load_rows
from pipelines.cli import parse

SIZES = (8, 16, 64, 256)
ENGINES = ("hf", "vllm")
RUNS = 3


def measure(cfg: Config, engine: str, batches: dict[int, Batch], params: SamplingParams) -> dict[str, float]:
    """generate() seconds per size (median of RUNS after a warm-up), generated tokens, weight-update seconds."""
    cfg = copy.deepcopy(cfg)
    cfg.rollout.engine = engine
    group = spawn(cfg)
    try:
        group.init_model(cfg, cfg.model.path, False)
        out: dict[str, float] = {}
        for size, prompts in batches.items():
            group.generate(prompts, params)  # warm-up (vLLM compiles and caches on first use)
            times, tokens = [], 0.0
            for _ in range(RUNS):
                start = time.perf_counter()
                samples = group.generate(prompts, params)
                times.append(time.perf_counter() - start)
                tokens = float(samples["response_mask"].sum())
            out[f"s@{size}"], out[f"tokens@{size}"] = statistics.median(times), tokens
        out["update_s"] = statistics.median(group.time_weight_update()[0] for _ in range(RUNS))
        return out
    finally:
        group.shutdown()


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    cfg = parse(__doc__, argv)
    ensure_inputs(cfg)
    ensure_ray(cfg.resources)
    params = SamplingParams(n=cfg.rollout.n, temperature=cfg.rollout.temperature,
                            max_new_tokens=cfg.rollout.max_new_tokens)
    rows = load_rows(cfg.data.dir, "train")
    batches = {size: next(iter(PromptLoader(rows, size, cfg.seed))) for size in SIZES}
    results = {engine: measure(cfg, engine, batches, params) for engine in tqdm(ENGINES, desc="engines")}
    hf, vllm = results["hf"], results["vllm"]
    table = []
    for size in SIZES:
        samples = size * params.n
        row = [f"{size} x {params.n}"]
        for engine in ENGINES:
            r = results[engine]
            row += [f"{samples / r[f's@{size}']:.0f}", f"{r[f'tokens@{size}'] / r[f's@{size}']:.0f}"]
        row.append(f"{hf[f's@{size}'] / vllm[f's@{size}']:.2f}x")
        table.append(row)
    table.append(["weight update s", f"{hf['update_s']:.4f}", "", f"{vllm['update_s']:.4f}", "",
                  f"{hf['update_s'] / vllm['update_s']:.2f}x"])
    print_table(f"Rollout throughput, 1 worker, max_new_tokens={params.max_new_tokens}, median of {RUNS} "
                "(weights unchanged: no generate loads them)",
                ["prompts", "hf samples/s", "hf tokens/s", "vllm samples/s", "vllm tokens/s", "vllm vs hf"], table)
    faster = "vllm" if vllm["s@16"] < hf["s@16"] else "hf"
    print(f"\nfaster at the demo's size (16 prompts x {params.n}): {faster}")
    return results


if __name__ == "__main__":
    main()
