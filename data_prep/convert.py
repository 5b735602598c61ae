"""Convert a user's JSONL + image folder into a prompt parquet file.

Each JSONL line is an object::

    {"prompt": str, "image": "a.png" | "images": ["a.png", ...], "answer": str,
     "data_source": str (optional), "id": str (optional), ...other fields}

Image paths are relative to the image folder. Other fields go into ``extra``.
The prompt becomes a single user message; if it holds fewer ``<image>``
placeholders than images, the missing ones are prepended. Every image is
resized to the pixel budget and stored as PNG.

A bad line never stops the run: it goes to a quarantine JSONL file with its
line number, its original text, a reason kind and a message naming the fix.
Blank lines are skipped and not counted. Every counted line is either written
or quarantined (checked), and both files are written under temporary names and
renamed, so a crash never leaves a half-written output.

Hostile lines are quarantined too: an image path that resolves outside the
image folder (``../``, absolute, or a symlink out: ``outside_image_dir``, never
read), a prompt longer than ``max_prompt_tokens`` with its images
(``too_long``), chat control tokens such as ``<|im_end|>`` in the prompt or
answer (``control_token``), text that is not valid Unicode (``bad_text``),
JSON too deep or with numbers too long to parse (``invalid_json``), paths the
file system refuses (``bad_path``); anything else a line triggers is
quarantined as ``error``.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps
from tqdm import tqdm

from data_prep.pixels import encode_png, resize_to_budget, to_rgb, validate_budget
from data_prep.schema import IMAGE_PLACEHOLDER, make_row, validate_row, write_parquet

DEFAULT_MAX_FILE_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_SOURCE_PIXELS = 50_000_000
_KNOWN_FIELDS = ("id", "prompt", "image", "images", "answer", "data_source")
# Chat-template control tokens (<|im_end|>, <|image_pad|>, ...): in user text they would end a turn early
# or desynchronise the image tokens from the image features.
_CONTROL_TOKEN = re.compile(r"<\|[^<>|\s]{1,64}\|>")

# (prompt, resized images) -> prompt tokens as the model sees them, image tokens included.
TokenCounter = Callable[[str, list[Image.Image]], int]


@dataclass
class ConvertReport:
    """Counts of one conversion; ``reasons`` counts quarantined lines by kind."""

    num_in: int = 0
    num_written: int = 0
    num_quarantined: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        """One line, e.g. 'convert: in=10 written=7 quarantined=3 (missing_file=2, corrupt=1)'."""
        line = f"convert: in={self.num_in} written={self.num_written} quarantined={self.num_quarantined}"
        if self.reasons:
            line += " (" + ", ".join(f"{kind}={n}" for kind, n in self.reasons.most_common()) + ")"
        return line


@dataclass(frozen=True)
class ImageLimits:
    """The pixel budget and the limits on source images."""

    min_pixels: int
    max_pixels: int
    factor: int = 28
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_source_pixels: int = DEFAULT_MAX_SOURCE_PIXELS

    def __post_init__(self) -> None:
        validate_budget(self.min_pixels, self.max_pixels, self.factor)
        if self.max_file_bytes < 1:
            raise ValueError(f"max_file_bytes={self.max_file_bytes} must be positive")
        if self.max_source_pixels < 1:
            raise ValueError(f"max_source_pixels={self.max_source_pixels} must be positive")


class RowRejected(Exception):
    """A line that cannot become a row; ``kind`` is a short reason key."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def _parse_line(raw: bytes) -> dict[str, Any]:
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise RowRejected("invalid_json", f"line is not valid UTF-8 ({err}); save the file as UTF-8") from err
    except json.JSONDecodeError as err:
        raise RowRejected("invalid_json", f"line is not valid JSON ({err}); fix the syntax") from err
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise RowRejected("invalid_json", f"line holds a value that cannot be parsed ({err}); shorten it") from err
    except RecursionError as err:
        raise RowRejected("invalid_json", "line is nested too deeply to parse; flatten it") from err
    if not isinstance(record, dict):
        raise RowRejected("invalid_json", "line is JSON but not an object; write one {...} object per line")
    _check_text(record)
    return record


def _check_text(record: dict[str, Any]) -> None:
    """Every string (keys included) must be encodable: JSON escapes can smuggle in lone surrogates."""
    stack: list[Any] = [record]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as err:
                raise RowRejected("bad_text", f"a string holds an invalid character ({err}); fix the text") from err


def _check_control_tokens(name: str, text: str) -> None:
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


def _image_paths(record: dict[str, Any]) -> list[str]:
    if "image" in record and "images" in record:
        raise RowRejected("bad_field", "both 'image' and 'images' are given; keep only one")
    if "image" not in record and "images" not in record:
        raise RowRejected("missing_field", "required field 'image' (or 'images') is missing; add the image path")
    paths = [record["image"]] if "image" in record else record["images"]
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise RowRejected("bad_field", "'image' must be a path string and 'images' a list of path strings")
    if not paths:
        raise RowRejected("missing_field", "'images' is empty; list at least one image path")
    return paths


def _place_images(prompt: str, num_images: int) -> str:
    """Prepend missing placeholders; more placeholders than images is an error."""
    found = prompt.count(IMAGE_PLACEHOLDER)
    if found > num_images:
        raise RowRejected(
            "placeholder_mismatch",
            f"prompt has {found} {IMAGE_PLACEHOLDER} placeholders but only {num_images} images; "
            f"remove placeholders or add images",
        )
    return IMAGE_PLACEHOLDER * (num_images - found) + prompt


@contextmanager
def _decoding(path: Path) -> Iterator[None]:
    """Turn any decoder failure into a rejection: a bad file must not stop the run."""
    try:
        yield
    except Image.DecompressionBombError as err:
        raise RowRejected("too_large", f"image {path} is a decompression bomb ({err}); shrink it") from err
    except Exception as err:
        raise RowRejected(
            "corrupt", f"image {path} cannot be decoded ({type(err).__name__}: {err}); re-export it or drop the row"
        ) from err


def _resolve_image(image_dir: Path, rel: str) -> Path:
    """The image's real path, which must lie inside ``image_dir`` (symlinks followed); nothing is read."""
    root = image_dir.resolve()
    try:
        path = (image_dir / rel).resolve()
    except (OSError, ValueError, RuntimeError) as err:  # a NUL byte, a symlink loop
        raise RowRejected("bad_path", f"image path {rel!r} cannot be resolved ({err}); fix the path") from err
    if not path.is_relative_to(root):
        raise RowRejected("outside_image_dir", f"image path {rel!r} resolves to {path}, outside the image folder "
                                               f"{root}; put the image inside that folder and give a relative path")
    return path


def _check_file(path: Path, limits: ImageLimits) -> None:
    try:
        _check_file_unsafe(path, limits)
    except OSError as err:  # a name too long for the file system, a permission error
        raise RowRejected("bad_path", f"image {str(path)[:200]!r} cannot be read ({err.strerror}); fix the path") from err


def _check_file_unsafe(path: Path, limits: ImageLimits) -> None:
    if not path.is_file():
        raise RowRejected("missing_file", f"image {path} does not exist; fix the path (relative to the image folder)")
    size = path.stat().st_size
    if size == 0:
        raise RowRejected("empty_file", f"image {path} is empty (0 bytes); re-export it or drop the row")
    if size > limits.max_file_bytes:
        raise RowRejected(
            "too_large", f"image {path} is {size} bytes, over max_file_bytes={limits.max_file_bytes}; shrink it"
        )


def load_source_image(path: Path, limits: ImageLimits) -> Image.Image:
    """Open, check and fully decode one source image as RGB, upright per EXIF."""
    _check_file(path, limits)
    with _decoding(path), Image.open(path) as img:  # reads the header only
        width, height = img.size
    if width * height > limits.max_source_pixels:
        raise RowRejected(
            "too_large",
            f"image {path} is {width}x{height} = {width * height} pixels, over "
            f"max_source_pixels={limits.max_source_pixels}; downscale it or raise the limit",
        )
    with _decoding(path):
        with Image.open(path) as img:
            img.verify()  # structural checks (e.g. PNG CRCs); leaves img unusable
        with Image.open(path) as img:
            img.load()
            return to_rgb(ImageOps.exif_transpose(img))


def _load_images(paths: list[str], image_dir: Path, limits: ImageLimits) -> list[Image.Image]:
    """The row's images, checked, decoded and fitted to the pixel budget."""
    resized = []
    for rel in paths:
        img = load_source_image(_resolve_image(image_dir, rel), limits)
        resized.append(resize_to_budget(img, limits.min_pixels, limits.max_pixels, limits.factor))
    return resized


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


def convert_record(
    record: dict[str, Any],
    default_id: str,
    image_dir: Path,
    limits: ImageLimits,
    data_source_default: str,
    count_tokens: TokenCounter | None = None,
    max_prompt_tokens: int = 0,
) -> dict[str, Any]:
    """One parsed JSONL object as a schema row; raises RowRejected if unusable."""
    row_id = _row_id(record, default_id)
    prompt, answer, paths = _prompt(record), _answer(record), _image_paths(record)
    _check_control_tokens("prompt", prompt)
    _check_control_tokens("answer", answer)
    source = _data_source(record, data_source_default)
    prompt = _place_images(prompt, len(paths))
    images = _load_images(paths, image_dir, limits)
    if count_tokens is not None and max_prompt_tokens > 0:
        tokens = count_tokens(prompt, images)
        if tokens > max_prompt_tokens:
            raise RowRejected("too_long", f"the prompt is {tokens} tokens with its images (counted with the model's "
                                          f"processor), over max_prompt_tokens={max_prompt_tokens}; shorten it, "
                                          "lower the pixel budget or raise data.max_prompt_tokens")
    extra = {k: v for k, v in record.items() if k not in _KNOWN_FIELDS}
    row = make_row(row_id, prompt, [encode_png(img) for img in images], answer, source, extra)
    validate_row(row)
    return row


def _quarantine(entries: list[dict[str, Any]], report: ConvertReport, line_no: int, raw: bytes,
                err: RowRejected) -> None:
    entries.append(_quarantine_entry(line_no, raw, err))
    report.reasons[err.kind] += 1


def _quarantine_entry(line_no: int, raw: bytes, err: RowRejected) -> dict[str, Any]:
    return {
        "line": line_no,
        "kind": err.kind,
        "reason": err.reason,
        "text": raw.decode("utf-8", errors="replace"),
    }


def _write_jsonl(entries: list[dict[str, Any]], path: Path) -> None:
    """Write under a temporary name, then rename (ASCII escapes: a quarantined line may hold any bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for entry in entries:
            out.write(json.dumps(entry) + "\n")
    os.replace(tmp, path)


def _check_inputs(jsonl_path: Path, image_dir: Path) -> None:
    if not jsonl_path.is_file():
        raise ValueError(f"JSONL file {jsonl_path} does not exist; pass the path of your data file")
    if not image_dir.is_dir():
        raise ValueError(f"image folder {image_dir} does not exist; pass the folder the image paths are relative to")


def convert_jsonl(
    jsonl_path: str | Path,
    image_dir: str | Path,
    out_parquet: str | Path,
    quarantine_path: str | Path,
    min_pixels: int,
    max_pixels: int,
    factor: int = 28,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_source_pixels: int = DEFAULT_MAX_SOURCE_PIXELS,
    data_source_default: str = "user",
    count_tokens: TokenCounter | None = None,
    max_prompt_tokens: int = 0,
) -> ConvertReport:
    """Convert a JSONL + image folder to a parquet file; bad lines go to quarantine.

    Row ids default to ``"<jsonl stem>-<line number>"`` unless a line has ``id``.
    The quarantine file is always written (empty when every line is good).
    ``count_tokens`` and ``max_prompt_tokens`` (> 0) quarantine over-long prompts.
    """
    jsonl_path, image_dir = Path(jsonl_path), Path(image_dir)
    _check_inputs(jsonl_path, image_dir)
    limits = ImageLimits(min_pixels, max_pixels, factor, max_file_bytes, max_source_pixels)
    report, rows, quarantined = ConvertReport(), [], []
    seen_ids: set[str] = set()
    lines = jsonl_path.read_bytes().splitlines()
    for line_no, raw in tqdm(enumerate(lines, start=1), total=len(lines), desc="convert", unit="line"):
        if not raw.strip():
            continue
        report.num_in += 1
        try:
            row = convert_record(
                _parse_line(raw), f"{jsonl_path.stem}-{line_no}", image_dir, limits, data_source_default,
                count_tokens, max_prompt_tokens,
            )
            if row["id"] in seen_ids:
                raise RowRejected("duplicate_id", f"id {row['id']!r} was used by an earlier line; make ids unique")
        except RowRejected as err:
            _quarantine(quarantined, report, line_no, raw, err)
            continue
        except Exception as err:  # the stage's promise: no input line can abort it
            _quarantine(quarantined, report, line_no, raw, RowRejected("error", f"{type(err).__name__}: {err}"))
            continue
        seen_ids.add(row["id"])
        rows.append(row)
    report.num_written, report.num_quarantined = len(rows), len(quarantined)
    if not report.num_in == report.num_written + report.num_quarantined == report.num_written + sum(
        report.reasons.values()
    ):
        raise RuntimeError(f"convert lost lines ({report.summary()}); nothing was written; please report this")
    write_parquet(rows, out_parquet)
    _write_jsonl(quarantined, Path(quarantine_path))
    return report
