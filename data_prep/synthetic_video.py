"""Synthetic video tasks whose answer needs time, not a single frame, written as real MP4 files (PyAV,
H.264) and read back through the same converter as a user's videos.

Tasks:
    first_colour -- a shape of one colour, then a shape of another colour; "Which colour appears first?"
                    (either colour alone is a frame of the clip: only the order tells them apart)
    direction    -- a dot moving left, right, up or down; "Which way does the dot move?"
                    (any single frame is just a dot)

Clips are ``frames`` frames of ``size`` x ``size`` at ``fps``, everything derived from a seed.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from data_prep.palette import BACKGROUND_RANGE, COLOURS
from data_prep.records import ImageLimits, RowConverter
from data_prep.rejects import RowRejected
from data_prep.video import VideoLimits
from mmrl.schema import VIDEO_PLACEHOLDER

DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
VIDEO_QUESTIONS: dict[str, str] = {
    "first_colour": "Which colour appears first?",
    "direction": "Which way does the dot move?",
}
VIDEO_ANSWERS: dict[str, tuple[str, ...]] = {"first_colour": tuple(COLOURS), "direction": tuple(DIRECTIONS)}
VIDEO_TASKS: tuple[str, ...] = tuple(VIDEO_QUESTIONS)


@dataclass(frozen=True)
class ClipSpec:
    """The size, length and rate of the synthetic clips."""

    size: int = 56
    frames: int = 4
    fps: float = 2.0

    def __post_init__(self) -> None:
        if self.size < 28 or self.size % 28:
            raise ValueError(f"video size={self.size} must be a multiple of 28 (the model's patch grid), at least 28")
        if self.frames < 2 or self.frames % 2:
            raise ValueError(f"video frames={self.frames} must be even and at least 2 (frames are merged in pairs)")


def _blank(size: int, grey: int) -> Image.Image:
    return Image.new("RGB", (size, size), (grey, grey, grey))


def _first_colour(rng: random.Random, spec: ClipSpec) -> tuple[list[np.ndarray], str, dict[str, Any]]:
    first, second = rng.sample(list(COLOURS), 2)
    grey = rng.randint(*BACKGROUND_RANGE)
    side = spec.size // 2
    frames, boxes = [], []
    for colour in (first, second):
        x0, y0 = rng.randint(2, spec.size - side - 2), rng.randint(2, spec.size - side - 2)
        boxes.append([x0, y0, side])
        img = _blank(spec.size, grey)
        ImageDraw.Draw(img).rectangle((x0, y0, x0 + side - 1, y0 + side - 1), fill=COLOURS[colour])
        frames += [np.asarray(img)] * (spec.frames // 2)
    return frames, first, {"colours": [first, second], "boxes": boxes, "background": grey}


def _direction(rng: random.Random, spec: ClipSpec) -> tuple[list[np.ndarray], str, dict[str, Any]]:
    name = rng.choice(list(DIRECTIONS))
    dx, dy = DIRECTIONS[name]
    grey = rng.randint(*BACKGROUND_RANGE)
    colour = COLOURS[rng.choice(list(COLOURS))]
    dot = max(6, spec.size // 6)
    travel = spec.size - dot - 4  # the dot crosses most of the frame
    step = travel // (spec.frames - 1)
    along = 2 if (dx + dy) > 0 else 2 + step * (spec.frames - 1)
    across = rng.randint(2, spec.size - dot - 2)
    frames, path = [], []
    for t in range(spec.frames):
        position = along + (dx + dy) * step * t
        x0, y0 = (position, across) if dx else (across, position)
        path.append([x0, y0])
        img = _blank(spec.size, grey)
        ImageDraw.Draw(img).ellipse((x0, y0, x0 + dot - 1, y0 + dot - 1), fill=colour)
        frames.append(np.asarray(img))
    return frames, name, {"path": path, "dot": dot, "background": grey}


RENDERERS = {"first_colour": _first_colour, "direction": _direction}


def write_mp4(frames: list[np.ndarray], path: Path, fps: float) -> None:
    """H.264 in MP4 (yuv420p, near-lossless), one frame per array (H, W, 3) uint8."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    height, width = frames[0].shape[:2]
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=int(round(fps)))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "12"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def clip_limits(spec: ClipSpec) -> VideoLimits:
    """Budgets that keep every synthetic frame at its size."""
    pixels = spec.size * spec.size
    return VideoLimits(min_pixels=pixels, frame_max_pixels=pixels, total_max_pixels=pixels * spec.frames, fps=spec.fps,
                       min_frames=spec.frames, max_frames=spec.frames)


def generate_video_rows(task: str, num: int, seed: int, spec: ClipSpec, media_dir: Path, id_prefix: str,
                        seen: set[str]) -> list[dict[str, Any]]:
    """``num`` rows of ``task``: each clip written to ``media_dir`` as MP4, then converted like a user's video
    (the same decoder, sampling and budgets). Clips already in ``seen`` (which is updated) are skipped."""
    if task not in RENDERERS:
        raise ValueError(f"unknown video task {task!r}; valid ones are {list(VIDEO_TASKS)}")
    rng = random.Random(seed)
    pixels = spec.size * spec.size
    images = ImageLimits(min_pixels=pixels, max_pixels=pixels, factor=28)
    rows: list[dict[str, Any]] = []
    with RowConverter(media_dir, images, clip_limits(spec), data_source_default=f"synthetic/{task}") as converter:
        attempts = 0
        while len(rows) < num:
            attempts += 1
            if attempts > 20 * num + 100:
                raise ValueError(f"too few distinct {task!r} clips at size {spec.size}; raise the video size")
            frames, answer, extra = RENDERERS[task](rng, spec)
            fingerprint = hashlib.sha256(b"".join(f.tobytes() for f in frames)).hexdigest()
            if fingerprint in seen:
                continue
            seen.add(fingerprint)
            row_id = f"{id_prefix}-{len(rows):06d}"
            rel = f"{id_prefix}/{row_id}.mp4"
            write_mp4(frames, media_dir / rel, spec.fps)
            record = {"id": row_id, "prompt": VIDEO_PLACEHOLDER + VIDEO_QUESTIONS[task], "video": rel,
                      "answer": answer, "task": task, **extra}
            try:
                rows.append(converter.convert(json.loads(json.dumps(record)), row_id))
            except RowRejected as err:  # a synthetic clip the converter refuses is a bug, not bad input
                raise RuntimeError(f"synthetic clip {rel} was rejected: {err.kind}: {err}") from err
    return rows
