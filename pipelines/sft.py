"""Stage ``make sft``: supervised warm start on the small labelled split (loss on answer tokens only).

Starts from ``sft.init`` (default ``model.path``) and writes ``<sft.out_dir>/checkpoint``, which
``make rl`` starts from. Departs from a full SFT on purpose: the labelled split is small, so RL has room.

    python -m pipelines.sft --config configs/demo.yaml sft.steps=100
"""

from __future__ import annotations

from mmrl.trainer.sft import run_sft
from pipelines.cli import parse


def main(argv: list[str] | None = None) -> dict:
    return run_sft(parse(__doc__, argv))


if __name__ == "__main__":
    main()
