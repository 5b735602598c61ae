"""Stage ``make eval``: greedy accuracy of ``eval.checkpoint`` on ``eval.split``, per data_source.

    python -m pipelines.eval --config configs/demo.yaml eval.checkpoint=outputs/sft/checkpoint
"""

from __future__ import annotations

from mmrl.trainer.eval_checkpoint import run_eval
from pipelines.cli import parse


def main(argv: list[str] | None = None) -> dict:
    return run_eval(parse(__doc__, argv))


if __name__ == "__main__":
    main()
