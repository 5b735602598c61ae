"""Stage ``make gpu-check``: a short GRPO run and a short PPO run (with a critic) on CUDA, tiny model.

Builds the tiny model and a small synthetic split under ``outputs/gpu_check/``, runs both algorithms for
``trainer.steps`` steps on every visible GPU (up to 2 workers, nccl between them when 2), and prints the
device and the mean step time of each. Without CUDA it stops with an error; ``resources.device=cpu`` runs
the same check on the CPU (to try the script, not the GPU).

    python -m pipelines.gpu_check --config configs/demo.yaml
"""

from __future__ import annotations

import statistics

import torch
from mlflow.tracking import MlflowClient

from mmrl.config import Config
from mmrl.models.tiny import build_tiny_vlm
from mmrl.tracking import tracking_uri
from mmrl.trainer.rl import run_rl
from pipelines import data, model
from pipelines.cli import parse_command

OUT = "outputs/gpu_check"
RUNS = {"grpo": (), "ppo": ("critic.llm.strategy=fsdp",)}


def check_overrides(cfg: Config) -> list[str]:
    """The overrides that make the user's config small and point it at ``outputs/gpu_check`` and the GPUs."""
    out = []
    if cfg.resources.device in ("auto", "cuda"):
        if not torch.cuda.is_available():
            raise SystemExit("gpu-check: CUDA is not available here (torch.cuda.is_available() is False); run it "
                             "on a GPU machine after `make install GPU=1`, or pass resources.device=cpu to try it")
        out += ["resources.device=cuda", f"resources.num_workers={min(2, torch.cuda.device_count())}"]
    return out + [
        f"model.path={OUT}/model", f"data.dir={OUT}/data", "data.sizes={sft: 16, train: 256, val: 16, test: 16}",
        f"trainer.steps={min(cfg.trainer.steps, 10)}", "trainer.eval_every=0", "trainer.val_size=16",
        "trainer.save_every=0", f"trainer.init={OUT}/model", "trainer.resume=never",
        f"tracking.uri=sqlite:///{OUT}/mlflow.db",
    ]


def mean_step_s(cfg: Config, run_id: str) -> tuple[float, float]:
    """Mean step time over the steps after the first (warm-up), and the first step's time."""
    history = MlflowClient(tracking_uri(cfg.tracking)).get_metric_history(run_id, "timing_s/step")
    times = [m.value for m in sorted(history, key=lambda m: m.step)]
    return statistics.mean(times[1:] or times), times[0]


def main(argv: list[str] | None = None) -> dict[str, float]:
    command = parse_command(__doc__, argv)
    small = check_overrides(command.load())
    cfg = command.load(*small)
    build_tiny_vlm(model.task_corpus(cfg), cfg.tiny_model, cfg.model.path, cfg.seed, cfg.model.family)
    data.synthetic(cfg)
    device = torch.cuda.get_device_name(0) if cfg.resources.device == "cuda" else "cpu"
    results = {}
    for name, overrides in RUNS.items():
        run_cfg = command.load(*small, f"algorithm.name={name}", f"trainer.out_dir={OUT}/{name}", *overrides)
        result = run_rl(run_cfg)
        results[name], first = mean_step_s(run_cfg, result["mlflow_run_id"])
        print(f"gpu-check: {name} on {run_cfg.resources.num_workers} x {device}: {results[name]:.3f} s/step "
              f"(first step {first:.2f} s, {run_cfg.trainer.steps} steps)", flush=True)
    return results


if __name__ == "__main__":
    main()
