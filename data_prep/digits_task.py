"""The digits task: real handwritten digit scans, "Which digit is written here?".

The images are the 1,797 scans of the UCI optical digits set that ship with scikit-learn
(``sklearn.datasets.load_digits``: 8 x 8 pixels of 17 grey levels, 43 writers' forms, about 180 of each digit).
They need no download and are real data: a writer's hand, not a drawing of mmrl's. Each scan is stored as what it
is, an 8 x 8 greyscale (``L``) PNG, ink dark on white, and goes through the same converter, pixel budget and
quarantine as a user's images (:class:`data_prep.records.RowConverter`), which fits it to the model's patch grid.

The splits are disjoint sets of scans, drawn by a permutation of the seed: ``test`` first, then ``val``, ``sft``
(the small labelled split) and ``train`` (RL's prompts). Their sizes together may not exceed the 1,797 scans.
"""

from __future__ import annotations

import io
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from data_prep.records import ImageLimits, InlineImage, RowConverter
from data_prep.rejects import RowRejected
from data_prep.synthetic import derive_seed
from data_prep.video import VideoLimits
from mmrl.answer_format import format_answer
from mmrl.schema import IMAGE_PLACEHOLDER

TASK = "digits"
QUESTION = "Which digit is written here?"
ANSWERS: tuple[str, ...] = tuple(str(d) for d in range(10))
SOURCE = "sklearn/digits"
SPLIT_ORDER = ("test", "val", "sft", "train")  # held-out splits are drawn first: a size change elsewhere keeps them
_LEVELS = 16  # the scans' grey levels are 0..16 (ink blocks counted in 4 x 4 cells)


def load_scans() -> tuple[np.ndarray, np.ndarray]:
    """The scans as uint8 images (N, 8, 8), ink dark on white, and their digits (N,)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    ink = np.rint(digits.images * (255 / _LEVELS)).astype(np.uint8)
    return 255 - ink, digits.target.astype(np.int64)


def scan_png(image: np.ndarray) -> bytes:
    """One scan (8, 8) uint8 as a greyscale PNG of its own size."""
    buffer = io.BytesIO()
    Image.fromarray(image, mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


def split_indices(sizes: Mapping[str, int], seed: int, total: int) -> dict[str, list[int]]:
    """Disjoint scan indices per split (``sizes``' splits, in :data:`SPLIT_ORDER`), a permutation of ``seed``."""
    unknown = sorted(set(sizes) - set(SPLIT_ORDER))
    if unknown:
        raise ValueError(f"data.sizes: the digits task has the splits {list(SPLIT_ORDER)}, not {unknown}")
    wanted = sum(sizes.values())
    if wanted > total:
        raise ValueError(f"data.sizes asks for {wanted} digit scans ({dict(sizes)}) but the set holds {total}: "
                         "lower data.sizes (each scan is in one split only)")
    order = list(range(total))
    random.Random(derive_seed(TASK, seed)).shuffle(order)
    out, start = {}, 0
    for split in (s for s in SPLIT_ORDER if s in sizes):
        out[split] = order[start: start + sizes[split]]
        start += sizes[split]
    return out


def digit_records(indices: list[int], images: np.ndarray, labels: np.ndarray, split: str) -> Iterator[dict[str, Any]]:
    """The converter's records of the scans at ``indices``: the scan inline, the question, the digit."""
    for i in indices:
        yield {"id": f"digits-{split}-{i:04d}", "prompt": IMAGE_PLACEHOLDER + QUESTION,
               "images": [InlineImage(scan_png(images[i]), f"scan {i}")], "answer": str(int(labels[i])),
               "task": TASK, "scan": i}


def digits_splits(sizes: Mapping[str, int], seed: int, limits: ImageLimits,
                  videos: VideoLimits) -> dict[str, list[dict[str, Any]]]:
    """The rows of every split, each scan converted through the pixel budget ``limits`` (a scan the converter
    refuses is a bug here, not bad input: it raises)."""
    images, labels = load_scans()
    rows: dict[str, list[dict[str, Any]]] = {}
    with RowConverter(Path("."), limits, videos, data_source_default=SOURCE) as converter:
        for split, indices in split_indices(sizes, seed, len(labels)).items():
            rows[split] = []
            for record in digit_records(indices, images, labels, split):
                try:
                    rows[split].append(converter.convert(record, record["id"]))
                except RowRejected as err:
                    raise RuntimeError(f"digit scan {record['scan']} was rejected: {err.kind}: {err}") from err
    return rows


def digits_corpus(copies: int = 50) -> Iterator[str]:
    """The task's texts for a tokenizer: the question and each answer, plain and in the answer format."""
    for _ in range(copies):
        yield QUESTION
        for answer in ANSWERS:
            yield from (answer, format_answer(answer))
