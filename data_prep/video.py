"""Reading a video file into sampled frames within pixel budgets, with decord, in a child process.

Sampling: ``round(duration * fps)`` frames, clamped to ``[min_frames, max_frames]`` and to the frames the
file has, and made even where possible (Qwen2/2.5-VL merge frames in pairs); their indices are spread
evenly over the video and their times kept. Budgets: each frame within ``min_pixels..frame_max_pixels``
(sides multiples of ``factor``), and all frames together within ``total_max_pixels``: frames shrink first,
down to ``min_pixels``, then fewer are taken. A video cut down by its budget is still written (counted as
``sampled_down``); one longer than ``max_seconds`` is rejected.

Decoding runs in a child process (:class:`VideoReader`): a decoder that crashes or hangs on a hostile file
costs that line (``decoder_crashed`` / ``video_timeout``), never the stage.
"""

from __future__ import annotations

import math
import multiprocessing as mp
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from data_prep.pixels import encode_png, fit_pixel_budget, qwen_size, validate_budget
from data_prep.rejects import RowRejected


@dataclass(frozen=True)
class VideoLimits:
    """How frames are sampled from a video and how large they may be."""

    min_pixels: int
    frame_max_pixels: int
    total_max_pixels: int
    factor: int = 28
    fps: float = 2.0
    min_frames: int = 2
    max_frames: int = 16
    max_seconds: float = 600.0
    timeout_s: float = 60.0
    sizing: str = "mmrl"
    """``qwen``: frames counted, chosen and sized by qwen-vl-utils' rules (:func:`qwen_plan`); ``mmrl``: mmrl's."""

    def __post_init__(self) -> None:
        validate_budget(self.min_pixels, self.frame_max_pixels, self.factor)
        if not 1 <= self.min_frames <= self.max_frames:
            raise ValueError(f"video frames: need 1 <= min_frames={self.min_frames} <= max_frames={self.max_frames}")
        if self.total_max_pixels < self.min_pixels:
            raise ValueError(f"total_max_pixels={self.total_max_pixels} is below min_pixels={self.min_pixels}")
        if not (self.fps > 0 and self.max_seconds > 0 and self.timeout_s > 0):
            raise ValueError("video fps, max_seconds and timeout_s must be positive")


@dataclass(frozen=True)
class Plan:
    """Which frames to take and at what size."""

    indices: list[int]
    size: tuple[int, int]
    sampled_down: bool


def plan_sampling(total_frames: int, native_fps: float, width: int, height: int, limits: VideoLimits) -> Plan:
    """The frame indices and the frame size for a video of ``total_frames`` at ``native_fps`` (qwen-vl-utils' with
    ``sizing="qwen"`` where its rules give a plan, else mmrl's)."""
    if limits.sizing == "qwen":
        plan = qwen_plan(total_frames, native_fps, width, height, limits)
        if plan is not None:
            return plan
    duration = total_frames / native_fps
    wanted = min(max(round(duration * limits.fps), limits.min_frames), limits.max_frames, total_frames)
    count = _even(wanted)
    per_frame = max(min(limits.frame_max_pixels, limits.total_max_pixels // count), limits.min_pixels)
    size = fit_pixel_budget(width, height, limits.min_pixels, per_frame, limits.factor)
    affordable = max(1, limits.total_max_pixels // (size[0] * size[1]))
    if count > affordable:
        count = _even(affordable)
    step = (total_frames - 1) / max(count - 1, 1)
    indices = sorted({min(total_frames - 1, round(i * step)) for i in range(count)})
    return Plan(indices=indices, size=size, sampled_down=count < min(round(duration * limits.fps), total_frames))


def qwen_plan(total_frames: int, native_fps: float, width: int, height: int, limits: VideoLimits) -> Plan | None:
    """qwen-vl-utils' plan (``fetch_video`` with decord): its frame count (``smart_nframes`` at ``limits.fps``
    within ``min_frames`` and ``max_frames``), its indices (``linspace(0, total - 1, count)``, rounded by torch),
    its per-frame budget (``total_max_pixels / count * 2``, the temporal patch covering two frames, within
    ``frame_max_pixels`` and at least ``1.05 * min_pixels``) and its ``smart_resize``. None where its rules
    refuse the video (a count outside [2, total], a size out of budget): mmrl's plan is used then."""
    import torch
    from qwen_vl_utils.vision_process import FRAME_FACTOR, VIDEO_MAX_TOKEN_NUM, smart_nframes

    rules = {"fps": limits.fps, "min_frames": limits.min_frames, "max_frames": limits.max_frames}
    try:
        count = smart_nframes(rules, total_frames=total_frames, video_fps=native_fps)
    except ValueError:
        return None
    ceiling = VIDEO_MAX_TOKEN_NUM * limits.factor**2  # qwen-vl-utils' own cap on a frame, then the caller's
    per_frame = min(max(min(ceiling, limits.total_max_pixels / count * FRAME_FACTOR), int(limits.min_pixels * 1.05)),
                    limits.frame_max_pixels)
    size = qwen_size(width, height, limits.min_pixels, per_frame, limits.factor)
    if size is None:
        return None
    indices = torch.linspace(0, total_frames - 1, count).round().long().tolist()
    return Plan(indices=indices, size=size, sampled_down=count < min(round(total_frames / native_fps * limits.fps),
                                                                       total_frames))


def _even(count: int) -> int:
    return count - 1 if count > 1 and count % 2 else count


def decode_video(path: str, limits: VideoLimits) -> dict[str, Any]:
    """The stored form of one video, ``{"frames": [PNG bytes], "timestamps": [s], "sampled_down": bool}``.

    Raises RowRejected: ``corrupt_video``, ``empty_video``, ``video_too_long``.
    """
    import decord
    from PIL import Image

    _probe(path)
    try:
        reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1)
        total, native_fps = len(reader), float(reader.get_avg_fps())
    except Exception as err:  # decord raises RuntimeError (DECORDError) for anything it cannot open
        raise RowRejected("corrupt_video", f"video {path} cannot be opened ({str(err).splitlines()[0][:200]}); "
                                           "re-encode it (e.g. H.264 in MP4) or drop the row") from err
    if total == 0:
        raise RowRejected("empty_video", f"video {path} has no frames; drop the row")
    if not native_fps > 0 or not math.isfinite(native_fps):
        raise RowRejected("corrupt_video", f"video {path} reports a frame rate of {native_fps}; re-encode it")
    if total / native_fps > limits.max_seconds:
        raise RowRejected("video_too_long", f"video {path} lasts {total / native_fps:.0f} s, over "
                                            f"data.max_video_seconds={limits.max_seconds:g}; cut it or raise the limit")
    height, width = reader[0].shape[:2]
    plan = plan_sampling(total, native_fps, width, height, limits)
    try:
        frames = reader.get_batch(plan.indices).asnumpy()
    except Exception as err:
        raise RowRejected("corrupt_video", f"video {path} fails to decode frames {plan.indices[:4]}... "
                                           f"({str(err).splitlines()[0][:200]}); re-encode it") from err
    pngs = [encode_png(Image.fromarray(frame).convert("RGB").resize(plan.size, Image.Resampling.BICUBIC))
            for frame in frames]
    return {"frames": pngs, "timestamps": [i / native_fps for i in plan.indices], "sampled_down": plan.sampled_down}


def _probe(path: str) -> None:
    """Reject a file with no video stream (an audio-only MP4, a video stream that got no frames) as
    ``empty_video`` before the decoder sees it; one the container library cannot open is ``corrupt_video``."""
    import av

    unreadable = f"video {path} cannot be opened; re-encode it (e.g. H.264 in MP4) or drop the row"
    try:
        with av.open(path) as container:
            kinds = [stream.type for stream in container.streams]
    except Exception as err:  # av raises its own error classes for every unreadable container
        raise RowRejected("corrupt_video", f"{unreadable} ({type(err).__name__}: {str(err)[:200]})") from err
    if not kinds:  # e.g. a truncated MP4 whose index (moov atom) is gone
        raise RowRejected("corrupt_video", f"{unreadable} (no readable streams: truncated?)")
    if "video" not in kinds:
        raise RowRejected("empty_video", f"video {path} has no video frames (streams: {kinds}); drop the row")


def _serve(conn: Connection) -> None:
    """The child process: decode requests until the parent closes the pipe."""
    while True:
        try:
            path, limits = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, decode_video(path, limits)))
        except RowRejected as err:
            conn.send((False, err))
        except Exception as err:  # anything else a file triggers is that file's problem
            conn.send((False, RowRejected("corrupt_video", f"video {path}: {type(err).__name__}: {err}")))


class VideoReader:
    """Decodes videos in one child process, restarted after a crash or a hang."""

    def __init__(self, limits: VideoLimits) -> None:
        self.limits = limits
        self._proc: Any = None
        self._conn: Connection | None = None

    def read(self, path: Path) -> dict[str, Any]:
        """See :func:`decode_video`; also ``decoder_crashed`` and ``video_timeout``."""
        conn = self._connection()
        conn.send((str(path), self.limits))
        if not conn.poll(self.limits.timeout_s):
            self.close()
            raise RowRejected("video_timeout", f"decoding video {path} took over {self.limits.timeout_s:g} s; "
                                               "re-encode it or drop the row")
        try:
            ok, payload = conn.recv()
        except (EOFError, OSError) as err:
            code = None
            if self._proc is not None:
                self._proc.join(timeout=5)  # the pipe closes before the process is reaped
                code = self._proc.exitcode
            self.close()
            raise RowRejected("decoder_crashed", f"the video decoder died on {path} (exit code {code}); "
                                                 "re-encode the file or drop the row") from err
        if not ok:
            raise payload
        return payload

    def _connection(self) -> Connection:
        if self._proc is None or not self._proc.is_alive():
            self.close()
            ctx = mp.get_context("spawn")
            self._conn, child = ctx.Pipe()
            self._proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="mmrl-video-decoder")
            self._proc.start()
            child.close()
        assert self._conn is not None
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5)
            self._proc = None

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
