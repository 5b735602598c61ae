"""Files in the peers' layouts, built the way each peer's own pipeline builds them (``datasets``: ``from_dict``,
``cast_column(Image())``, ``map``, ``to_parquet``, ``save_to_disk``), on real images: scikit-learn's bundled scans
of handwritten digits (8x8, 17 grey levels) and its two photographs (china.jpg, flower.jpg, 640x427), both offline.

- verl: its examples/data_preprocess scripts map a source dataset to ``data_source``, a chat ``prompt``, ``images``
  (the Image feature), ``ability``, ``reward_model: {style: rule, ground_truth}`` and ``extra_info: {split,
  index}``, then write ``<split>.parquet`` with ``to_parquet``;
- EasyR1: ``problem`` (with ``<image>``), ``answer`` and ``images``, as bytes (hiyouga/geometry3k, a DatasetDict of
  train / validation / test) or as paths read under its ``data.image_dir``;
- TRL: its grpo_vlm.py example maps ``problem`` to a conversational ``prompt`` (a system message, then the user's),
  keeps the ``image`` column (one Image) and the ``solution`` column that its reward functions read.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from PIL import Image

SYSTEM = "Look at the picture and answer with one word."
DIGIT_QUESTION = "<image>Which digit is written here?"


@functools.cache
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images, digits.target


def digit(index: int) -> Image.Image:
    """Scan ``index`` of scikit-learn's digits as an 8x8 grey image (0..16 scaled to 255..0: dark ink on white)."""
    images, _ = _digits()
    return Image.fromarray((255 - images[index] * 255 / 16).round().astype(np.uint8), mode="L")


def digit_label(index: int) -> str:
    return str(int(_digits()[1][index]))


@functools.cache
def _photos() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_sample_images

    return tuple(load_sample_images().images)


def photo(index: int, side: int = 160) -> Image.Image:
    """A ``side`` x ``side`` crop of scikit-learn's photograph ``index`` (0: china.jpg, 1: flower.jpg), RGB."""
    pixels = _photos()[index]
    top, left = (pixels.shape[0] - side) // 2, (pixels.shape[1] - side) // 2
    return Image.fromarray(pixels[top:top + side, left:left + side])


def _image_features(**columns: object):
    from datasets import Features, List, Value
    from datasets import Image as ImageFeature

    kinds = {"string": Value("string"), "image": ImageFeature(), "images": List(ImageFeature())}
    return Features({name: kinds[kind] for name, kind in columns.items()})


def verl_parquet(folder: Path, split: str, count: int, start: int = 0, system: bool = True) -> Path:
    """verl's preprocessing of a digits dataset (as its geo3k.py does for Geometry3K): ``<folder>/<split>.parquet``."""
    from datasets import Dataset

    indices = range(start, start + count)
    source = Dataset.from_dict({"problem": [DIGIT_QUESTION] * count, "answer": [digit_label(i) for i in indices],
                                "images": [[digit(i)] for i in indices]},
                               features=_image_features(problem="string", answer="string", images="images"))

    def process(example: dict, index: int) -> dict:
        messages = [{"role": "system", "content": SYSTEM}] if system else []
        return {"data_source": "sklearn/digits", "ability": "vision",
                "prompt": messages + [{"role": "user", "content": example["problem"]}], "images": example["images"],
                "reward_model": {"style": "rule", "ground_truth": example["answer"]},
                "extra_info": {"split": split, "index": index}}

    data = source.map(process, with_indices=True, remove_columns=["problem", "answer"])
    path = folder / f"{split}.parquet"
    data.to_parquet(str(path))
    return path


def photo_files(media: Path) -> list[str]:
    """The two photographs as PNG files in ``media/photos``; their paths relative to ``media``."""
    (media / "photos").mkdir(parents=True, exist_ok=True)
    names = []
    for index, name in enumerate(("china", "flower")):
        photo(index).save(media / "photos" / f"{name}.png")
        names.append(f"photos/{name}.png")
    return names


def easyr1_parquet_with_paths(folder: Path, media: Path, split: str, count: int) -> Path:
    """EasyR1's layout with images as paths under its ``data.image_dir`` (``media``), two photographs a row."""
    from datasets import Dataset

    china, flower = photo_files(media)
    pairs = [[china, flower] if i % 2 == 0 else [flower, china] for i in range(count)]
    data = Dataset.from_dict({"problem": ["<image><image>Which photograph shows a flower, the first or the second?"]
                              * count, "answer": ["second" if i % 2 == 0 else "first" for i in range(count)],
                              "images": pairs, "difficulty": [1 + i % 3 for i in range(count)]})
    path = folder / f"{split}.parquet"
    data.to_parquet(str(path))
    return path


def easyr1_dataset_dict(folder: Path, sizes: dict[str, int]) -> Path:
    """EasyR1's layout with images as bytes, a DatasetDict of ``sizes`` splits (hiyouga/geometry3k's: train,
    validation, test) saved with ``save_to_disk``."""
    from datasets import Dataset, DatasetDict

    splits, start = {}, 0
    for name, count in sizes.items():
        indices = range(start, start + count)
        splits[name] = Dataset.from_dict(
            {"problem": [DIGIT_QUESTION] * count, "answer": [digit_label(i) for i in indices],
             "images": [[digit(i)] for i in indices]},
            features=_image_features(problem="string", answer="string", images="images"))
        start += count
    path = folder / "easyr1_dict"
    DatasetDict(splits).save_to_disk(str(path))
    return path


def trl_dataset(count: int, start: int = 0, parts: bool = False):
    """TRL's grpo_vlm.py preparation of a digits dataset: ``prompt`` (a system message, then the user's; the
    user's content typed parts when ``parts``), ``image`` and ``solution``."""
    from datasets import Dataset

    indices = range(start, start + count)
    source = Dataset.from_dict({"problem": ["Which digit is written here?"] * count,
                                "solution": [digit_label(i) for i in indices], "image": [digit(i) for i in indices]},
                               features=_image_features(problem="string", solution="string", image="image"))

    def make_conversation(example: dict) -> dict:
        if not parts:
            return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": example["problem"]}]}
        # Typed parts in every message: an Arrow column holds one type, so the system message's content is parts too.
        return {"prompt": [{"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
                           {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": example["problem"]}]}]}

    return source.map(make_conversation, remove_columns=["problem"])


def trl_parquet(folder: Path, split: str, count: int, start: int = 0, parts: bool = True) -> Path:
    path = folder / f"{split}.parquet"
    trl_dataset(count, start, parts).to_parquet(str(path))
    return path


def trl_folder(folder: Path, name: str, count: int, start: int = 0) -> Path:
    """A TRL dataset saved with ``Dataset.save_to_disk`` as ``<folder>/<name>`` (one Dataset, no splits)."""
    path = folder / name
    trl_dataset(count, start).save_to_disk(str(path))
    return path


def convert_checked(tmp_path: Path, source: Path, fmt: str, split: str = "train", media: Path | None = None):
    """(report, rows by id, quarantine entries by row number) of one conversion at a small pixel budget, each row
    valid and the counts adding up (in = written + quarantined)."""
    import json

    from data_prep.convert import convert_jsonl
    from mmrl.schema import read_parquet, validate_row

    out, quarantine = tmp_path / "out.parquet", tmp_path / "q.jsonl"
    report = convert_jsonl(source, media or source.parent, out, quarantine, fmt=fmt, split=split,
                           min_pixels=28 * 28, max_pixels=56 * 56)
    rows = read_parquet(out)
    entries = [json.loads(line) for line in quarantine.read_text().splitlines()]
    assert report.num_in == report.num_written + report.num_quarantined == len(rows) + len(entries)
    for row in rows:
        validate_row(row)
    return report, {r["id"]: r for r in rows}, {e["line"]: e for e in entries}
