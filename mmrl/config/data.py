"""The data sections: where the prompts live, the synthetic task mix and each task's own keys, media budgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mmrl.config_fields import num


@dataclass(kw_only=True)
class ZoomTaskConfig:
    """The zoom task's keys (``data.zoom``): the agent task of :mod:`data_prep.zoom_task`, a board of cells whose
    questions need a ``zoom_in`` call, and how its ``sft`` split demonstrates the calls."""

    grid: int = num(4, ge=1)
    """The zoom task's cells per side (its board is ``image_size`` px)."""
    shapes: int = num(3, ge=1, le=3)
    """Shapes in each of the zoom task's cells (1 to 3, of different kinds and colours)."""
    spot: int = num(0, ge=0)
    """Side, in the board's pixels, of the square at each cell's centre that holds its shapes (0: the whole cell):
    the demonstrations zoom on it, and a smaller spot makes a zoomed shape larger."""
    call_share: float = num(1.0, ge=0, le=1)
    """Share of the zoom task's demonstrations (its ``sft`` split) whose ``zoom_in`` call is trained; the others
    show the call as context and train the answer only (reading the zoomed image), leaving where to zoom to RL."""
    direct_share: float = num(0.0, ge=0, le=1)
    """Share of the zoom task's ``sft`` rows that answer from the full view, without a call (spread evenly): SFT
    then teaches both ways and leaves RL to teach when to zoom."""
    direct_by_kind: dict[str, float] = field(default_factory=dict)
    """``direct_share`` per kind of shape asked about (circle, square, triangle; a kind not named keeps
    ``direct_share``), spread evenly within each kind: the question, not the draw of the SFT weights, then
    sets whether the greedy SFT policy calls."""
    call_cells: Literal["question", "random"] = "question"
    """Where the trained calls zoom: on the question's cell, or on a random cell (their answers then context
    only): SFT teaches the call's format and reading the zoomed image, and RL alone where to zoom."""
    cell_names: Literal["grid", "letters"] = "grid"
    """How the zoom task's questions name a cell: ``grid``, "in cell B2"; ``letters``, "in cell Bb" (no digit,
    which the tiny model's calls and tool schema are full of)."""


@dataclass(kw_only=True)
class DataConfig:
    dir: str = "outputs/data"
    """Folder of the prompt parquet files, one per split (``<dir>/<split>.parquet``)."""
    tasks: dict[str, float] = field(default_factory=lambda: {"colour": 1.0})
    """Synthetic task mix: task name -> fraction. Images: colour, count, shape, compare_count (two images);
    videos: first_colour, direction; ``zoom`` (alone: the agent task of :mod:`data_prep.zoom_task`, whose
    ``sft`` split holds demonstrated episodes)."""
    sizes: dict[str, int] = field(default_factory=lambda: {"sft": 48, "train": 2048, "val": 128, "test": 400})
    """Rows per split for the synthetic generator."""
    image_size: int = num(112, ge=1)
    """Side of the synthetic square images, in pixels."""
    max_count: int = num(3, ge=1)
    """Largest number of shapes in the count task."""
    min_pixels: int = num(28 * 28, ge=1)
    """Pixel budget, lower bound, applied to a user's images."""
    max_pixels: int = num(448 * 448, ge=1)
    """Pixel budget, upper bound, applied to a user's images (sides are rounded to multiples of the model's
    patch size times its merge size, read from the processor at ``model.path``). For the Qwen families the size is
    qwen-vl-utils' ``smart_resize`` (the same as Qwen's tools and vLLM give), mmrl's own rule only where it has no
    usable answer (an aspect ratio over 200, a budget its rounding misses)."""
    jsonl: str = ""
    """A user's data file: when set, ``make data`` converts it instead of generating the synthetic tasks. A JSONL of
    {prompt, image|images, answer} (``format=jsonl``), or a peer's file or folder (``format``)."""
    format: Literal["jsonl", "verl", "easyr1", "trl", "hf"] = "jsonl"
    """The layout of ``jsonl`` (:mod:`data_prep.peer_formats`): mmrl's JSONL, verl's, EasyR1's or TRL's parquet, or
    a Hugging Face ``datasets`` folder (``save_to_disk``, of a Dataset or a DatasetDict) in any of them."""
    image_dir: str = ""
    """Folder that the data file's media paths are relative to (default: the file's folder)."""
    split: str = ""
    """The split the converter writes (``train``, ``val``, ``test``, ``sft``; ``validation``, ``valid`` and ``dev``
    mean ``val``), and of a DatasetDict the one it reads. Empty: ``train``; of a DatasetDict, every split, each to
    the file mmrl reads it from (:mod:`data_prep.splits`)."""
    max_prompt_tokens: int = num(4096, ge=1)
    """The converter quarantines a row whose prompt (counted with the model's processor, image tokens
    included) is longer."""
    video_fps: float = num(2.0, gt=0)
    """Frames sampled per second of video (also the rate of the synthetic clips)."""
    video_min_frames: int = num(2, ge=1)
    video_max_frames: int = num(16, ge=1)
    """Frames kept per video; a longer video is sampled evenly within this (and counted as sampled down)."""
    video_frame_max_pixels: int = num(224 * 224, ge=1)
    """Pixel budget of one video frame (lower bound: ``min_pixels``)."""
    video_max_pixels: int = num(8 * 224 * 224, ge=1)
    """Pixel budget of all of a video's frames together: frames shrink first, then fewer are kept. For the Qwen
    families, qwen-vl-utils' rules (its ``total_pixels``): the frame count comes from ``video_fps`` and the frame
    limits, and each frame gets ``video_max_pixels / frames * 2`` (a temporal patch covers two frames), within
    ``video_frame_max_pixels``."""
    max_video_seconds: float = num(600.0, gt=0)
    """A longer video is quarantined (``video_too_long``)."""
    video_timeout_s: float = num(60.0, gt=0)
    """Decoding one video may take this long before it is quarantined (``video_timeout``)."""
    video_size: int = num(56, ge=28)
    """Side of the synthetic clips' frames, in pixels (a multiple of 28)."""
    video_frames: int = num(4, ge=2)
    """Frames of a synthetic clip (even)."""
    zoom: ZoomTaskConfig = field(default_factory=ZoomTaskConfig)
    """The zoom task's own keys."""


