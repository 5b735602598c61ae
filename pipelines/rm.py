"""Stage ``make rm``: a VLM reward model trained on preference pairs (Bradley-Terry loss).

Starts from ``rm.init`` (default: the SFT policy), trains on ``rm.train_pairs`` (default: synthetic pairs
made from the train split's labels), prints the held-out pairwise accuracy on the val split's pairs and
writes ``<rm.out_dir>/checkpoint``, which ``reward.model.path`` loads. RLHF end to end:

    make rm && make rl CONFIG=configs/rlhf.yaml
"""

from __future__ import annotations

from mmrl.trainer.rm import run_rm
from pipelines.cli import parse


def main(argv: list[str] | None = None) -> dict:
    return run_rm(parse(__doc__, argv))


if __name__ == "__main__":
    main()
