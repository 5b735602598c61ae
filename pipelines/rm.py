"""Stage ``make rm``: a VLM reward model trained on preference pairs (Bradley-Terry loss).

Starts from ``rm.init`` (default: the SFT policy), trains on ``rm.train_pairs`` (default: synthetic pairs
made from the train split's labels), prints the held-out pairwise accuracy on the val split's pairs and
writes ``<rm.out_dir>/checkpoint``, which ``reward.model.path`` loads. RLHF end to end:

    make rm && make rl CONFIG=configs/rlhf.yaml
"""

from __future__ import annotations

from pathlib import Path

from data_prep.preferences import synthetic_pairs, write_pairs
from mmrl.config import Config
from mmrl.trainer.dataset import load_rows
from mmrl.trainer.rm import run_rm
from pipelines.cli import parse_command


def synthetic_pair_files(cfg: Config) -> list[str]:
    """For ``rm.train_pairs`` and ``rm.val_pairs`` left empty: synthetic pairs made from the split's labels,
    written to ``<rm.out_dir>/pairs_<split>.jsonl``; returns the overrides that name those files."""
    overrides = []
    for split, seed in (("train", cfg.seed), ("val", cfg.seed + 1)):
        if not getattr(cfg.rm, f"{split}_pairs"):
            pairs = synthetic_pairs(load_rows(cfg.data.dir, split), cfg.rm.pairs_per_prompt, seed)
            path = write_pairs(Path(cfg.rm.out_dir) / f"pairs_{split}.jsonl", pairs)
            overrides.append(f"rm.{split}_pairs={path}")
    return overrides


def main(argv: list[str] | None = None) -> dict:
    command = parse_command(__doc__, argv)
    return run_rm(command.load(*synthetic_pair_files(command.load())))


if __name__ == "__main__":
    main()
