"""Synthetic visual tasks whose answer needs the image, drawn with PIL.

Tasks:
    colour        -- one filled shape of one of six colours; "What colour is the shape?"
    count         -- 1..max_count non-overlapping shapes; "How many shapes are there?"
    shape         -- one shape of a random colour; "What shape is it?"
    compare_count -- two images with different numbers of shapes; "Which image has more shapes, the
                     first or the second?" (a multi-image prompt)
    first_colour, direction -- video tasks (:mod:`data_prep.synthetic_video`), mixed in by
                     :func:`build_splits` when given a :class:`VideoSynthesis`

Everything is derived from an integer seed, so the same arguments give the
same PNG bytes. Shapes are drawn without anti-aliasing, so every pixel is
either the background grey or one of the exact colours in ``COLOURS``. Each
row's ``extra`` records the drawn layout (kinds, colours, boxes, background).
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from data_prep.palette import BACKGROUND_RANGE, COLOURS
from data_prep.pixels import encode_png
from data_prep.synthetic_video import VIDEO_ANSWERS, VIDEO_QUESTIONS, VIDEO_TASKS, ClipSpec, generate_video_rows
from mmrl.schema import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, make_row

SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
QUESTIONS: dict[str, str] = {
    "colour": "What colour is the shape?",
    "count": "How many shapes are there?",
    "shape": "What shape is it?",
    "compare_count": "Which image has more shapes, the first or the second?",
}
IMAGE_TASKS: tuple[str, ...] = tuple(QUESTIONS)
TASKS: tuple[str, ...] = IMAGE_TASKS + VIDEO_TASKS

MAX_COUNT_LIMIT = 9  # keeps every count answer a single digit listed below
MIN_IMAGE_SIZE = 56
_MIN_SIDE = 8  # smallest drawn shape, in pixels
_GAP = 3  # pixels kept free between shapes so they never touch
_MARGIN = 2

SYNTHETIC_ANSWERS: tuple[str, ...] = tuple(dict.fromkeys((
    *COLOURS,
    *SHAPES,
    *(str(n) for n in range(1, MAX_COUNT_LIMIT + 1)),
    "first",
    "second",
    *(answer for answers in VIDEO_ANSWERS.values() for answer in answers),
)))
SYNTHETIC_QUESTIONS: tuple[str, ...] = (*QUESTIONS.values(), *VIDEO_QUESTIONS.values())
# Every word and punctuation mark the synthetic tasks can produce.
SYNTHETIC_VOCABULARY: tuple[str, ...] = tuple(
    sorted({tok for text in SYNTHETIC_QUESTIONS + SYNTHETIC_ANSWERS for tok in re.findall(r"\w+|[^\w\s]", text)})
)

Box = tuple[int, int, int]  # x0, y0, side


def derive_seed(*parts: object) -> int:
    """A 64-bit seed derived from the parts, stable across runs and platforms."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; valid tasks are {list(TASKS)}")


def _check_sizes(image_size: int, max_count: int) -> None:
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size={image_size} is too small to draw shapes; use at least {MIN_IMAGE_SIZE}")
    if not 1 <= max_count <= MAX_COUNT_LIMIT:
        raise ValueError(f"max_count={max_count} must be between 1 and {MAX_COUNT_LIMIT}")


def _draw_shape(draw: ImageDraw.ImageDraw, kind: str, box: Box, colour: tuple[int, int, int]) -> None:
    x0, y0, side = box
    x1, y1 = x0 + side - 1, y0 + side - 1  # PIL boxes include both ends
    if kind == "circle":
        draw.ellipse((x0, y0, x1, y1), fill=colour)
    elif kind == "square":
        draw.rectangle((x0, y0, x1, y1), fill=colour)
    else:
        draw.polygon([((x0 + x1) / 2, y0), (x0, y1), (x1, y1)], fill=colour)


def _random_box(rng: random.Random, image_size: int, side_lo: int, side_hi: int) -> Box:
    side = rng.randint(side_lo, side_hi)
    x0 = rng.randint(_MARGIN, image_size - side - _MARGIN)
    y0 = rng.randint(_MARGIN, image_size - side - _MARGIN)
    return x0, y0, side


def _apart(a: Box, b: Box) -> bool:
    """True if the boxes are at least _GAP pixels apart on some axis."""
    return (
        a[0] + a[2] + _GAP <= b[0]
        or b[0] + b[2] + _GAP <= a[0]
        or a[1] + a[2] + _GAP <= b[1]
        or b[1] + b[2] + _GAP <= a[1]
    )


def _place_boxes(rng: random.Random, count: int, image_size: int) -> list[Box]:
    """Non-overlapping boxes by rejection sampling; sides shrink as count grows."""
    cells = math.ceil(math.sqrt(count))
    side_hi = max(_MIN_SIDE, int(image_size / (cells * 1.6)))
    side_lo = max(_MIN_SIDE, side_hi * 2 // 3)
    for _ in range(100):
        boxes: list[Box] = []
        for _ in range(200):
            box = _random_box(rng, image_size, side_lo, side_hi)
            if all(_apart(box, other) for other in boxes):
                boxes.append(box)
                if len(boxes) == count:
                    return boxes
    raise ValueError(f"could not place {count} shapes in {image_size}px; raise image_size or lower max_count")


def _render(shapes: list[dict[str, Any]], image_size: int, grey: int) -> bytes:
    img = Image.new("RGB", (image_size, image_size), (grey, grey, grey))
    draw = ImageDraw.Draw(img)
    for shape in shapes:
        _draw_shape(draw, shape["kind"], tuple(shape["box"]), COLOURS[shape["colour"]])
    return encode_png(img)


def _single_shape(rng: random.Random, image_size: int) -> dict[str, Any]:
    box = _random_box(rng, image_size, int(image_size * 0.3), int(image_size * 0.6))
    return {"kind": rng.choice(SHAPES), "colour": rng.choice(list(COLOURS)), "box": list(box)}


def _shapes(rng: random.Random, count: int, image_size: int) -> list[dict[str, Any]]:
    boxes = _place_boxes(rng, count, image_size)
    return [{"kind": rng.choice(SHAPES), "colour": rng.choice(list(COLOURS)), "box": list(b)} for b in boxes]


def _layout(task: str, rng: random.Random, image_size: int, max_count: int) -> tuple[list[list[dict[str, Any]]], str]:
    """The shapes to draw in each image of the row, and the answer."""
    if task == "count":
        shapes = _shapes(rng, rng.randint(1, max_count), image_size)
        return [shapes], str(len(shapes))
    if task == "compare_count":
        if max_count < 2:
            raise ValueError("compare_count needs max_count >= 2 (the two images differ in their counts)")
        first, second = rng.sample(range(1, max_count + 1), 2)
        return [_shapes(rng, first, image_size), _shapes(rng, second, image_size)], "first" if first > second else "second"
    shape = _single_shape(rng, image_size)
    return [[shape]], shape["colour"] if task == "colour" else shape["kind"]


def _generate(
    task: str,
    num: int,
    seed: int,
    image_size: int,
    max_count: int,
    id_prefix: str,
    seen: set[str],
) -> list[dict[str, Any]]:
    """``num`` rows whose images are not in ``seen`` (which is updated)."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    attempts = 0
    while len(rows) < num:
        attempts += 1
        if attempts > 20 * num + 100:
            raise ValueError(f"too few distinct {task!r} images at image_size={image_size}; raise image_size")
        grey = rng.randint(*BACKGROUND_RANGE)
        layouts, answer = _layout(task, rng, image_size, max_count)
        pngs = [_render(shapes, image_size, grey) for shapes in layouts]
        fingerprint = hashlib.sha256(b"".join(pngs)).hexdigest()
        if fingerprint in seen:
            continue
        seen.add(fingerprint)
        extra = {"task": task, "background": [grey] * 3, "shapes": layouts[0] if len(layouts) == 1 else layouts}
        row_id = f"{id_prefix}-{len(rows):06d}"
        prompt = IMAGE_PLACEHOLDER * len(pngs) + QUESTIONS[task]
        rows.append(make_row(row_id, prompt, pngs, answer, f"synthetic/{task}", extra))
    return rows


def generate_rows(task: str, num: int, seed: int, image_size: int = 112, max_count: int = 3) -> list[dict[str, Any]]:
    """``num`` distinct schema rows of one synthetic image task, deterministic in ``seed``."""
    if task not in IMAGE_TASKS:
        raise ValueError(f"{task!r} is not a synthetic image task; valid ones are {list(IMAGE_TASKS)} (video tasks "
                         "are built by build_splits with a VideoSynthesis)")
    _check_sizes(image_size, max_count)
    if num < 0:
        raise ValueError(f"num={num} must be zero or more")
    return _generate(task, num, derive_seed(seed, task), image_size, max_count, f"{task}-s{seed}", set())


def allocate_counts(fractions: Mapping[str, float], total: int) -> dict[str, int]:
    """Split ``total`` by the fractions with largest remainders, summing exactly to total."""
    weight = sum(fractions.values())
    exact = {name: total * frac / weight for name, frac in fractions.items()}
    counts = {name: math.floor(value) for name, value in exact.items()}
    order = sorted(exact, key=lambda name: counts[name] - exact[name])  # stable: ties keep input order
    for name in order[: total - sum(counts.values())]:
        counts[name] += 1
    return counts


def _check_mix(tasks: Mapping[str, float], sizes: Mapping[str, int]) -> None:
    for task, fraction in tasks.items():
        _check_task(task)
        if fraction < 0:
            raise ValueError(f"fraction of task {task!r} is {fraction}; fractions must be zero or more")
    if sum(tasks.values()) <= 0:
        raise ValueError(f"task fractions {dict(tasks)} sum to zero; give at least one task a positive fraction")
    for split, size in sizes.items():
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"size of split {split!r} is {size!r}; use an integer zero or more")


@dataclass(frozen=True)
class VideoSynthesis:
    """Where synthetic clips are written (as MP4) and their shape."""

    media_dir: Path
    clip: ClipSpec = ClipSpec()


def build_splits(
    tasks: Mapping[str, float],
    sizes: Mapping[str, int],
    seed: int,
    image_size: int = 112,
    max_count: int = 3,
    video: VideoSynthesis | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Rows for each split (e.g. sft/train/val/test), mixing tasks by fraction.

    Each split and task draws from its own derived seed, and no image or clip occurs
    twice across all splits. Rows inside a split are shuffled. Video tasks need ``video``.
    """
    _check_mix(tasks, sizes)
    _check_sizes(image_size, max_count)
    if video is None and any(task in VIDEO_TASKS and fraction > 0 for task, fraction in tasks.items()):
        raise ValueError(f"video tasks {[t for t in tasks if t in VIDEO_TASKS]} need a VideoSynthesis (where to "
                         "write the clips)")
    seen: set[str] = set()
    splits: dict[str, list[dict[str, Any]]] = {}
    for split, size in sizes.items():
        split_seed = derive_seed(seed, "split", split)
        rows: list[dict[str, Any]] = []
        for task, count in allocate_counts(tasks, size).items():
            task_seed = derive_seed(split_seed, task)
            prefix = f"{split}-{task}"
            if task in VIDEO_TASKS:
                assert video is not None
                rows += generate_video_rows(task, count, task_seed, video.clip, video.media_dir, prefix, seen)
            else:
                rows += _generate(task, count, task_seed, image_size, max_count, prefix, seen)
        random.Random(split_seed).shuffle(rows)
        splits[split] = rows
    return splits


def _strip_placeholders(text: str) -> str:
    return text.replace(IMAGE_PLACEHOLDER, "").replace(VIDEO_PLACEHOLDER, "").strip()


def corpus_texts(rows: Iterable[Mapping[str, Any]]) -> Iterator[str]:
    """Every message text and answer of the rows, for training a tokenizer.

    ``<image>`` placeholders are removed: the tokenizer is expected to add the
    placeholder as a special token rather than learn it from text.
    """
    for row in rows:
        for message in row["messages"]:
            text = _strip_placeholders(message["content"])
            if text:
                yield text
        yield row["answer"]
