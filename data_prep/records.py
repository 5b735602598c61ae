"""One JSONL record (a dict) -> one schema row: fields checked, media confined to the media folder,
decoded and fitted to the pixel budgets, the prompt's placeholders and length checked.

A record that cannot become a row raises :class:`~data_prep.rejects.RowRejected` with a reason kind;
:mod:`data_prep.convert` quarantines it.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps

from data_prep.pixels import encode_png, resize_to_budget, validate_budget
from data_prep.rejects import RowRejected
from data_prep.video import VideoLimits, VideoReader, plan_sampling
from mmrl.image_modes import to_rgb
from mmrl.schema import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, Video, decode_video, make_row, validate_row

DEFAULT_MAX_FILE_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_VIDEO_BYTES = 500 * 1024 * 1024
DEFAULT_MAX_SOURCE_PIXELS = 50_000_000
DEFAULT_MIN_SOURCE_SIDE = 4
"""A source image with a side shorter (a 1x1 tracking pixel, a broken export) is quarantined: upscaled to the
budget it would be a flat square, no picture to ask about. 8x8 scans (scikit-learn's digits) still pass."""
KNOWN_FIELDS = ("id", "prompt", "system", "image", "images", "video", "videos", "answer", "data_source")
# Chat-template control tokens (<|im_end|>, <|image_pad|>, ...): in user text they would end a turn early
# or desynchronise the image tokens from the image features.
_CONTROL_TOKEN = re.compile(r"<\|[^<>|\s]{1,64}\|>")

# (prompt, resized images, sampled videos) -> prompt tokens as the model sees them, media tokens included.
TokenCounter = Callable[[str, list[Image.Image], list[Video]], int]


@dataclass(frozen=True)
class ImageLimits:
    """The pixel budget and the limits on source images."""

    min_pixels: int
    max_pixels: int
    factor: int = 28
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_source_pixels: int = DEFAULT_MAX_SOURCE_PIXELS
    sizing: str = "mmrl"
    """How an image is fitted to the budget (:data:`data_prep.pixels.SIZINGS`): ``qwen`` for the Qwen families."""
    min_source_side: int = DEFAULT_MIN_SOURCE_SIDE

    def __post_init__(self) -> None:
        validate_budget(self.min_pixels, self.max_pixels, self.factor)
        if self.max_file_bytes < 1:
            raise ValueError(f"max_file_bytes={self.max_file_bytes} must be positive")
        if self.max_source_pixels < 1:
            raise ValueError(f"max_source_pixels={self.max_source_pixels} must be positive")
        if self.min_source_side < 1:
            raise ValueError(f"min_source_side={self.min_source_side} must be positive")


# ---- fields -----------------------------------------------------------------------------------


def check_control_tokens(name: str, text: str) -> None:
    found = _CONTROL_TOKEN.search(text)
    if found:
        raise RowRejected("control_token", f"{name!r} contains the chat control token {found.group()!r}, which "
                                           "would break the chat template; remove it from the text")


def _required(record: dict[str, Any], name: str) -> Any:
    if record.get(name) in (None, ""):
        raise RowRejected("missing_field", f"required field {name!r} is missing or empty; add it")
    return record[name]


def _answer(record: dict[str, Any]) -> str:
    answer = _required(record, "answer")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise RowRejected("bad_field", f"'answer' is {type(answer).__name__}; write it as a string")
    return str(answer)


def _prompt(record: dict[str, Any]) -> str:
    prompt = _required(record, "prompt")
    if not isinstance(prompt, str):
        raise RowRejected("bad_field", f"'prompt' is {type(prompt).__name__}; write it as a string")
    return prompt


@dataclass(frozen=True)
class InlineImage:
    """An image given by its encoded bytes (a peer format's ``{"bytes": ...}``), named ``name`` in messages."""

    data: bytes
    name: str


@dataclass(frozen=True)
class FrameList:
    """A video given as its frames (paths or inline images), taken at ``fps`` frames a second."""

    frames: tuple[str | InlineImage, ...]
    fps: float


MediaItem = str | InlineImage | FrameList
"""A record's image or video: a path relative to the media folder (JSONL records have only these), or what the
peer formats' readers (:mod:`data_prep.peer_formats`) give besides."""


def _system(record: dict[str, Any]) -> str:
    """The optional system message's text (media placeholders are not allowed in it)."""
    system = record.get("system", "")
    if not isinstance(system, str):
        raise RowRejected("bad_field", f"'system' is {type(system).__name__}; write it as a string")
    if IMAGE_PLACEHOLDER in system or VIDEO_PLACEHOLDER in system:
        raise RowRejected("placeholder_mismatch", "the system message holds a media placeholder; put the media "
                                                  "in the user message")
    check_control_tokens("system", system)
    return system


def _paths(record: dict[str, Any], kind: str) -> list[MediaItem]:
    """The media of ``kind`` ("image" or "video") from ``kind`` or ``kind + "s"``; may be empty."""
    one, many = kind, f"{kind}s"
    if one in record and many in record:
        raise RowRejected("bad_field", f"both {one!r} and {many!r} are given; keep only one")
    if one not in record and many not in record:
        return []
    paths = [record[one]] if one in record else record[many]
    allowed = (InlineImage,) if kind == "image" else (FrameList,)
    if not isinstance(paths, list) or not all((isinstance(p, str) and p) or isinstance(p, allowed) for p in paths):
        raise RowRejected("bad_field", f"{one!r} must be a path string and {many!r} a list of path strings")
    if not paths:
        raise RowRejected("missing_field", f"{many!r} is empty; list at least one path or drop the field")
    return paths


def _place(prompt: str, placeholder: str, count: int, kind: str) -> str:
    """Prepend missing placeholders; more placeholders than media is an error."""
    found = prompt.count(placeholder)
    if found > count:
        raise RowRejected("placeholder_mismatch", f"prompt has {found} {placeholder} placeholders but only {count} "
                                                  f"{kind}s; remove placeholders or add {kind}s")
    return placeholder * (count - found) + prompt


def _row_id(record: dict[str, Any], default: str) -> str:
    row_id = record.get("id", default)
    if isinstance(row_id, bool) or not isinstance(row_id, (str, int)) or row_id == "":
        raise RowRejected("bad_field", f"'id' is {row_id!r}; use a non-empty string or drop the field")
    return str(row_id)


def _data_source(record: dict[str, Any], default: str) -> str:
    source = record.get("data_source", default)
    if not isinstance(source, str) or not source:
        raise RowRejected("bad_field", f"'data_source' is {source!r}; use a non-empty string or drop the field")
    return source


# ---- media files ------------------------------------------------------------------------------


def resolve_media(media_dir: Path, rel: str, kind: str = "image") -> Path:
    """The file's real path, which must lie inside ``media_dir`` (symlinks followed); nothing is read."""
    root = media_dir.resolve()
    try:
        path = (media_dir / rel).resolve()
    except (OSError, ValueError, RuntimeError) as err:  # a NUL byte, a symlink loop
        raise RowRejected("bad_path", f"{kind} path {rel!r} cannot be resolved ({err}); fix the path") from err
    if not path.is_relative_to(root):
        raise RowRejected("outside_image_dir", f"{kind} path {rel!r} resolves to {path}, outside the media folder "
                                               f"{root}; put the file inside that folder and give a relative path, "
                                               "or set data.image_dir to a folder that holds it")
    return path


def check_file(path: Path, max_bytes: int, kind: str = "image") -> None:
    """The file exists, is not empty and not over ``max_bytes``."""
    try:
        if not path.is_file():
            what = "is not a file" if path.exists() else "does not exist"
            raise RowRejected("missing_file", f"{kind} {path} {what}; fix the path (relative to the media folder)")
        size = path.stat().st_size
    except OSError as err:  # a name too long for the file system, a permission error
        raise RowRejected("bad_path", f"{kind} {str(path)[:200]!r} cannot be read ({err.strerror}); fix the "
                                      "path") from err
    if size == 0:
        raise RowRejected("empty_file", f"{kind} {path} is empty (0 bytes); re-export it or drop the row")
    if size > max_bytes:
        raise RowRejected("too_large", f"{kind} {path} is {size} bytes, over the limit of {max_bytes}; shrink it")


@contextmanager
def _decoding(path: Path | str) -> Iterator[None]:
    """Turn any decoder failure into a rejection: a bad file must not stop the run."""
    try:
        yield
    except Image.DecompressionBombError as err:
        raise RowRejected("too_large", f"image {path} is a decompression bomb ({err}); shrink it") from err
    except PermissionError as err:
        raise RowRejected("unreadable", f"image {path} cannot be read ({err.strerror}); make it readable or drop "
                                        "the row") from err
    except Exception as err:
        raise RowRejected(
            "corrupt", f"image {path} cannot be decoded ({type(err).__name__}: {err}); re-export it or drop the row"
        ) from err


def load_source_image(path: Path, limits: ImageLimits) -> Image.Image:
    """Open, check and fully decode one source image as RGB, upright per EXIF."""
    check_file(path, limits.max_file_bytes)
    return _decode(lambda: Image.open(path), str(path), limits)


def load_image_bytes(data: bytes, name: str, limits: ImageLimits) -> Image.Image:
    """:func:`load_source_image` for an image given by its encoded bytes (named ``name`` in messages)."""
    if not data:
        raise RowRejected("empty_file", f"image {name} is empty (0 bytes); re-export it or drop the row")
    if len(data) > limits.max_file_bytes:
        raise RowRejected("too_large", f"image {name} is {len(data)} bytes, over the limit of {limits.max_file_bytes}; "
                                       "shrink it")
    return _decode(lambda: Image.open(io.BytesIO(data)), name, limits)


def _decode(open_image: Callable[[], Image.Image], name: str, limits: ImageLimits) -> Image.Image:
    with _decoding(name), open_image() as img:  # reads the header only
        width, height = img.size
    if width * height > limits.max_source_pixels:
        raise RowRejected(
            "too_large",
            f"image {name} is {width}x{height} = {width * height} pixels, over "
            f"max_source_pixels={limits.max_source_pixels}; downscale it or raise the limit",
        )
    if min(width, height) < limits.min_source_side:
        raise RowRejected("too_small", f"image {name} is {width}x{height} pixels, a side under "
                                       f"{limits.min_source_side}: no picture to ask about (a placeholder pixel or a "
                                       "broken export?); re-export it or drop the row")
    with _decoding(name):
        with open_image() as img:
            img.verify()  # structural checks (e.g. PNG CRCs); leaves img unusable
        with open_image() as img:
            img.load()
            return to_rgb(ImageOps.exif_transpose(img))


# ---- the record -------------------------------------------------------------------------------


@dataclass
class RowConverter:
    """Turns records into rows; holds the video decoder process (close it, or use as a context manager)."""

    media_dir: Path
    images: ImageLimits
    videos: VideoLimits
    data_source_default: str = "user"
    count_tokens: TokenCounter | None = None
    max_prompt_tokens: int = 0
    max_video_bytes: int = DEFAULT_MAX_VIDEO_BYTES
    videos_sampled_down: int = 0
    """Videos cut to fit their frame or pixel budget (they are still written)."""
    _reader: VideoReader = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._reader = VideoReader(self.videos)

    def convert(self, record: dict[str, Any], default_id: str) -> dict[str, Any]:
        """One parsed JSONL object as a schema row; raises RowRejected if unusable."""
        row_id = _row_id(record, default_id)
        prompt, answer = _prompt(record), _answer(record)
        image_paths, video_paths = _paths(record, "image"), _paths(record, "video")
        if not image_paths and not video_paths:
            raise RowRejected("missing_field", "the line has no 'image', 'images', 'video' or 'videos'; add one")
        check_control_tokens("prompt", prompt)
        check_control_tokens("answer", answer)
        system = _system(record)
        source = _data_source(record, self.data_source_default)
        prompt = _place(_place(prompt, VIDEO_PLACEHOLDER, len(video_paths), "video"), IMAGE_PLACEHOLDER,
                        len(image_paths), "image")
        images = [self._image(rel) for rel in image_paths]
        videos = [self._video(rel) for rel in video_paths]
        if self.count_tokens is not None and self.max_prompt_tokens > 0:
            tokens = self.count_tokens(prompt, images, [decode_video(v) for v in videos])
            if tokens > self.max_prompt_tokens:
                raise RowRejected("too_long", f"the prompt is {tokens} tokens with its media (counted with the model's "
                                              f"processor), over max_prompt_tokens={self.max_prompt_tokens}; shorten "
                                              "it, lower the pixel budgets or raise data.max_prompt_tokens")
        extra = {k: v for k, v in record.items() if k not in KNOWN_FIELDS}
        row = make_row(row_id, prompt, [encode_png(img) for img in images], answer, source, extra, videos=videos)
        if system:
            row["messages"].insert(0, {"role": "system", "content": system})
        validate_row(row)
        return row

    def _image(self, item: str | InlineImage) -> Image.Image:
        return resize_to_budget(self._source_image(item), self.images.min_pixels, self.images.max_pixels,
                                self.images.factor, self.images.sizing)

    def _source_image(self, item: str | InlineImage) -> Image.Image:
        if isinstance(item, InlineImage):
            return load_image_bytes(item.data, item.name, self.images)
        return load_source_image(resolve_media(self.media_dir, item), self.images)

    def _video(self, item: str | FrameList) -> dict[str, Any]:
        if isinstance(item, FrameList):
            return self._frames(item)
        path = resolve_media(self.media_dir, item, "video")
        check_file(path, self.max_video_bytes, "video")
        stored = self._reader.read(path)
        self.videos_sampled_down += stored.pop("sampled_down")
        return stored

    def _frames(self, video: FrameList) -> dict[str, Any]:
        """A video given as frames: sampled and sized as a decoded file of that frame rate would be."""
        if not video.frames:
            raise RowRejected("empty_video", "a video is an empty list of frames; give its frames or drop it")
        first = self._source_image(video.frames[0])
        plan = plan_sampling(len(video.frames), video.fps, first.width, first.height, self.videos)
        self.videos_sampled_down += plan.sampled_down
        frames = [first if i == 0 else self._source_image(video.frames[i]) for i in plan.indices]
        pngs = [encode_png(f.resize(plan.size, Image.Resampling.BICUBIC)) for f in frames]
        return {"frames": pngs, "timestamps": [i / video.fps for i in plan.indices]}

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> RowConverter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
