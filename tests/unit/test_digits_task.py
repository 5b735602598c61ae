"""The digits task: real scans from scikit-learn in disjoint splits, each fitted to the pixel budget through the
converter (its own size and mode going in), its digit the answer."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from data_prep.digits_task import (
    ANSWERS,
    QUESTION,
    SOURCE,
    digits_corpus,
    digits_splits,
    load_scans,
    scan_png,
    split_indices,
)
from data_prep.records import ImageLimits
from data_prep.video import VideoLimits
from mmrl.answer_format import format_answer
from mmrl.schema import validate_row

LIMITS = ImageLimits(min_pixels=56 * 56, max_pixels=112 * 112, factor=28)
VIDEOS = VideoLimits(min_pixels=28 * 28, frame_max_pixels=56 * 56, total_max_pixels=4 * 56 * 56)


def test_splits_are_disjoint_seeded_and_held_out_first() -> None:
    sizes = {"sft": 20, "train": 300, "val": 30, "test": 100}
    a, b = split_indices(sizes, 0, 1797), split_indices(sizes, 1, 1797)
    assert {k: len(v) for k, v in a.items()} == sizes
    flat = [i for part in a.values() for i in part]
    assert len(set(flat)) == len(flat) and all(0 <= i < 1797 for i in flat)
    assert a == split_indices(sizes, 0, 1797) and a["test"] != b["test"]
    # A larger train split draws more scans without moving the held-out ones.
    assert split_indices({**sizes, "train": 900}, 0, 1797)["test"] == a["test"]


def test_split_sizes_past_the_set_or_unknown_splits_are_refused() -> None:
    with pytest.raises(ValueError, match="asks for 1800 digit scans.*holds 1797"):
        split_indices({"train": 1700, "test": 100}, 0, 1797)
    with pytest.raises(ValueError, match="not \\['dev'\\]"):
        split_indices({"dev": 5}, 0, 1797)


def test_a_scan_is_stored_as_its_own_8x8_greyscale_image_ink_dark() -> None:
    raw = load_digits()
    images, labels = load_scans()
    assert images.shape == (1797, 8, 8) and (labels == raw.target).all()
    image = Image.open(io.BytesIO(scan_png(images[5])))
    assert image.size == (8, 8) and image.mode == "L"
    expected = 255 - np.rint(raw.images[5] * 255 / 16)  # 0 (no ink) -> white, 16 -> black
    assert np.array_equal(np.asarray(image, dtype=np.float64), expected)


def test_rows_carry_the_scan_fitted_to_the_budget_and_its_digit() -> None:
    rows = digits_splits({"test": 6, "sft": 4}, 3, LIMITS, VIDEOS)
    raw = load_digits()
    chosen = split_indices({"test": 6, "sft": 4}, 3, 1797)
    for split, part in rows.items():
        assert len(part) == len(chosen[split])
        for row, index in zip(part, chosen[split]):
            validate_row(row)
            assert row["answer"] == str(raw.target[index]) and row["data_source"] == SOURCE
            assert row["messages"] == [{"role": "user", "content": "<image>" + QUESTION}]
            assert json.loads(row["extra"])["scan"] == index
            image = Image.open(io.BytesIO(row["images"][0])).convert("L")
            assert image.size == (56, 56)  # 8 x 8 is under min_pixels: grown to the smallest grid that fits it
            # The stored image is the scan: averaged back to 8 x 8 it follows the scan's ink.
            back = np.asarray(image.resize((8, 8), Image.Resampling.BOX), dtype=np.float64)
            ink = raw.images[index]
            assert np.corrcoef(back.ravel(), ink.ravel())[0, 1] < -0.9


def test_the_corpus_holds_the_question_and_every_digit_in_the_answer_format() -> None:
    texts = set(digits_corpus(copies=1))
    assert QUESTION in texts and ANSWERS == tuple("0123456789")
    assert {format_answer(d) for d in ANSWERS} <= texts


def test_make_data_generates_the_digits_alone_and_the_demo_config_fits_the_set() -> None:
    from mmrl.config import load_config
    from pipelines.data import digits

    with pytest.raises(ValueError, match="digits task is generated alone.*\\['colour'\\]"):
        digits(load_config("configs/digits_demo.yaml", ["data.tasks={digits: 0.5, colour: 0.5}"]))
    cfg = load_config("configs/digits_demo.yaml")
    assert sum(cfg.data.sizes.values()) <= 1797 and cfg.bar.gain >= 0.10
