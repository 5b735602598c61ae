"""Stage ``make rl``: GRPO (or another algorithm) on Ray, from ``trainer.init``, tracked in MLflow.

One controller (this process) drives the hybrid actor/rollout/reference worker group. Writes
``<trainer.out_dir>/checkpoint``.

    python -m pipelines.rl --config configs/demo.yaml algorithm.name=rloo rollout.n=8
"""

from __future__ import annotations

from mmrl.trainer.run import run_rl
from pipelines.cli import parse


def main(argv: list[str] | None = None) -> dict:
    result = run_rl(parse(__doc__, argv))
    print(f"rl: done, mlflow run {result['mlflow_run_id']}")
    return result


if __name__ == "__main__":
    main()
