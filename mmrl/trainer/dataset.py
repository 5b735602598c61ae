"""Prompt rows from the data-prep parquet files, as Batches of prompts."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mmrl.protocol import Batch
from mmrl.trainer.pass_rates import SamplingRules
from mmrl.schema import read_parquet


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
    """Prompt rows -> a Batch of prompts: uid, messages, images (PNG bytes), videos (stored frames), answer,
    data_source, extra."""
    return Batch(
        objects={
            "uid": [str(r["id"]) for r in rows],
            "messages": [list(r["messages"]) for r in rows],
            "images": [list(r["images"]) for r in rows],
            "videos": [list(r.get("videos") or []) for r in rows],
            "answer": [str(r["answer"]) for r in rows],
            "data_source": [str(r["data_source"]) for r in rows],
            "extra": [json.loads(r["extra"]) if r.get("extra") else {} for r in rows],
        }
    )


class PromptLoader:
    """Endless batches of ``batch_size`` prompts, reshuffled every epoch from ``seed`` (an incomplete last
    batch of an epoch is dropped). Its position is part of a checkpoint (:meth:`state_dict`)."""

    def __init__(self, rows: list[dict[str, Any]], batch_size: int, seed: int, rules: SamplingRules | None = None
                 ) -> None:
        if len(rows) < batch_size:
            raise ValueError(f"the train split has {len(rows)} rows, fewer than trainer.prompts_per_step={batch_size}")
        self.rows, self.batch_size, self.rng = rows, batch_size, random.Random(seed)
        self.rules = rules if rules is not None and rules.active else None
        self.order: list[int] = []
        self.position = 0

    def next_batch(self) -> Batch:
        """The next ``batch_size`` prompts (with sampling rules: the next ones the rules draw; an epoch in which
        they would draw too few is taken as it is, so that the loader never stalls)."""
        if self.rules is None:
            return rows_to_batch([self.rows[i] for i in self._take(self.batch_size)])
        chosen: list[int] = []
        looked = 0
        while len(chosen) < self.batch_size:
            (index,) = self._take(1)
            looked += 1
            if looked > len(self.rows) or self.rules.draw(str(self.rows[index]["id"]), self.rng):
                chosen.append(index)
        return rows_to_batch([self.rows[i] for i in chosen])

    def _take(self, count: int) -> list[int]:
        if self.position + count > len(self.order):
            self.order = list(range(len(self.rows)))
            self.rng.shuffle(self.order)
            self.position = 0
        indices = self.order[self.position : self.position + count]
        self.position += count
        return indices

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "order": list(self.order), "position": self.position,
                "num_rows": len(self.rows)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_rows"] != len(self.rows):
            raise ValueError(f"the checkpoint's prompt loader read a train split of {state['num_rows']} rows, "
                             f"this one has {len(self.rows)}; resume with the same data.dir")
        self.rng.setstate(state["rng"])
        self.order, self.position = list(state["order"]), state["position"]
