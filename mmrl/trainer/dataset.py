"""Prompt rows from the data-prep parquet files, as Batches of prompts."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from data_prep.schema import read_parquet
from mmrl.protocol import Batch


def split_path(data_dir: str | Path, split: str) -> Path:
    path = Path(data_dir) / f"{split}.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"split {split!r} not found at {path}; run `make data` (or set data.dir)")
    return path


def load_rows(data_dir: str | Path, split: str, limit: int = 0) -> list[dict[str, Any]]:
    """Rows of ``<data_dir>/<split>.parquet`` (the first ``limit`` when positive)."""
    dataset = read_parquet(split_path(data_dir, split))
    if limit > 0:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return [dict(row) for row in dataset]


def rows_to_batch(rows: list[dict[str, Any]]) -> Batch:
    """Prompt rows -> a Batch of prompts: uid, messages, images (PNG bytes), answer, data_source, extra."""
    return Batch(
        objects={
            "uid": [str(r["id"]) for r in rows],
            "messages": [list(r["messages"]) for r in rows],
            "images": [list(r["images"]) for r in rows],
            "answer": [str(r["answer"]) for r in rows],
            "data_source": [str(r["data_source"]) for r in rows],
            "extra": [json.loads(r["extra"]) if r.get("extra") else {} for r in rows],
        }
    )


class PromptLoader:
    """Endless batches of ``batch_size`` prompts, reshuffled every epoch from ``seed``."""

    def __init__(self, rows: list[dict[str, Any]], batch_size: int, seed: int) -> None:
        if len(rows) < batch_size:
            raise ValueError(f"the train split has {len(rows)} rows, fewer than trainer.prompts_per_step={batch_size}")
        self.rows, self.batch_size, self.rng = rows, batch_size, random.Random(seed)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            order = list(range(len(self.rows)))
            self.rng.shuffle(order)
            for start in range(0, len(order) - self.batch_size + 1, self.batch_size):
                yield rows_to_batch([self.rows[i] for i in order[start : start + self.batch_size]])
