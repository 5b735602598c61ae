"""Convert a user's JSONL + media folder into a prompt parquet file.

Each JSONL line is an object::

    {"prompt": str, "image": "a.png" | "images": ["a.png", ...],
     "video": "a.mp4" | "videos": ["a.mp4", ...], "answer": str,
     "data_source": str (optional), "id": str (optional), ...other fields}

A line has images, videos or both. Paths are relative to the media folder.
Other fields go into ``extra``. The prompt becomes a single user message; if
it holds fewer ``<image>`` / ``<video>`` placeholders than media, the missing
ones are prepended. Every image is resized to the pixel budget and stored as
PNG; every video is decoded once (decord, in a child process), its frames
sampled and sized within the video budgets (:mod:`data_prep.video`) and stored
as PNG frames with their timestamps.

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
quarantined as ``error``. Videos add ``corrupt_video`` (truncated, not a
video), ``empty_video`` (no frames), ``video_too_long`` (over
``max_video_seconds``), ``decoder_crashed`` and ``video_timeout``; a video
longer than its frame budget is sampled within it and counted
(``sampled_down``), not quarantined.
"""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from data_prep.parquet import write_parquet
from data_prep.peer_formats import FORMATS, Source, peer_sources
from data_prep.peer_tables import hf_split_names
from data_prep.records import (  # noqa: F401  (ImageLimits and load_source_image are part of this API)
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_SOURCE_PIXELS,
    ImageLimits,
    RowConverter,
    TokenCounter,
    load_source_image,
)
from data_prep.rejects import RowRejected
from data_prep.splits import plan_splits
from data_prep.video import VideoLimits


@dataclass
class ConvertReport:
    """Counts of one conversion; ``reasons`` counts quarantined lines by kind."""

    num_in: int = 0
    num_written: int = 0
    num_quarantined: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    videos_sampled_down: int = 0
    notes: list[str] = field(default_factory=list)
    """What the input holds that mmrl cannot carry (e.g. binary columns left out); each is also warned."""

    def summary(self) -> str:
        """One line, e.g. 'convert: in=10 written=7 quarantined=3 (missing_file=2, corrupt=1)'."""
        line = f"convert: in={self.num_in} written={self.num_written} quarantined={self.num_quarantined}"
        if self.reasons:
            line += " (" + ", ".join(f"{kind}={n}" for kind, n in self.reasons.most_common()) + ")"
        if self.videos_sampled_down:
            line += f"; {self.videos_sampled_down} videos sampled down to their budget"
        return "\n".join([line, *(f"note: {note}" for note in self.notes)])


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


def _quarantine(entries: list[dict[str, Any]], report: ConvertReport, line_no: int, text: str,
                err: RowRejected, row_index: bool) -> None:
    entry = {"line": line_no, "kind": err.kind, "reason": err.reason, "text": text}
    if row_index:  # a table's row: also its index as the table reads it (dataset[index])
        entry = {"line": line_no, "index": line_no - 1} | entry
    entries.append(entry)
    report.reasons[err.kind] += 1


def _write_jsonl(entries: list[dict[str, Any]], path: Path) -> None:
    """Write under a temporary name, then rename (ASCII escapes: a quarantined line may hold any bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for entry in entries:
            out.write(json.dumps(entry) + "\n")
    os.replace(tmp, path)


def _check_inputs(jsonl_path: Path, media_dir: Path, fmt: str = "jsonl") -> None:
    if fmt not in FORMATS:
        raise ValueError(f"data format {fmt!r} is unknown; allowed: {', '.join(FORMATS)}")
    if fmt == "hf" and not jsonl_path.is_dir():
        raise ValueError(f"{jsonl_path} is not a folder; data.format=hf reads a datasets folder (save_to_disk)")
    if fmt != "hf" and not jsonl_path.is_file():
        raise ValueError(f"data file {jsonl_path} does not exist; pass the path of your data file")
    if not media_dir.is_dir():
        raise ValueError(f"media folder {media_dir} does not exist; pass the folder the paths are relative to")


def convert_lines(lines: list[bytes], converter: RowConverter, id_prefix: str
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], ConvertReport]:
    """Rows, quarantine entries and the report for JSONL ``lines`` (blank ones are skipped, not counted)."""
    sources = ((line_no, raw.decode("utf-8", errors="replace"), partial(_parse_line, raw))
               for line_no, raw in enumerate(lines, start=1) if raw.strip())
    return convert_records(sources, converter, id_prefix, total=sum(1 for raw in lines if raw.strip()))


def convert_records(sources: Iterable[Source], converter: RowConverter, id_prefix: str, total: int | None = None,
                    row_index: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]], ConvertReport]:
    """Rows, quarantine entries and the report for ``sources``: every one is written or quarantined. ``row_index``:
    the sources are a table's rows, and a quarantine entry also gives the row's index from 0."""
    report, rows, quarantined = ConvertReport(), [], []
    seen_ids: set[str] = set()
    for line_no, text, read in tqdm(sources, total=total, desc="convert", unit="row"):
        report.num_in += 1
        try:
            row = converter.convert(read(), f"{id_prefix}-{line_no}")
            if row["id"] in seen_ids:
                raise RowRejected("duplicate_id", f"id {row['id']!r} was used by an earlier line; make ids unique")
        except RowRejected as err:
            _quarantine(quarantined, report, line_no, text, err, row_index)
            continue
        except Exception as err:  # the stage's promise: no input line can abort it
            _quarantine(quarantined, report, line_no, text, RowRejected("error", f"{type(err).__name__}: {err}"),
                        row_index)
            continue
        seen_ids.add(row["id"])
        rows.append(row)
    report.num_written, report.num_quarantined = len(rows), len(quarantined)
    report.videos_sampled_down = converter.videos_sampled_down
    if not report.num_in == report.num_written + report.num_quarantined == report.num_written + sum(
        report.reasons.values()
    ):
        raise RuntimeError(f"convert lost lines ({report.summary()}); nothing was written; please report this")
    return rows, quarantined, report


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
    video_limits: VideoLimits | None = None,
    sizing: str = "mmrl",
    fmt: str = "jsonl",
    split: str = "train",
) -> ConvertReport:
    """Convert a JSONL + media folder (``image_dir``) to a parquet file; bad lines go to quarantine.

    Row ids default to ``"<jsonl stem>-<line number>"`` unless a line has ``id``.
    The quarantine file is always written (empty when every line is good).
    ``count_tokens`` and ``max_prompt_tokens`` (> 0) quarantine over-long prompts. ``video_limits``
    default to 2 fps, 2..16 frames, each within the image budget and 8 frames' worth in all. ``sizing``: how images
    are fitted to the budget (:data:`data_prep.pixels.SIZINGS`; the video limits carry their own). ``fmt``: the
    input's layout, ``jsonl`` (mmrl's, above) or a peer's (:mod:`data_prep.peer_formats`: ``verl``, ``easyr1`` and
    ``trl`` parquet files, ``hf`` a ``datasets`` folder, whose ``split`` is read when it holds several; a peer's
    quarantine entries also give the row's ``index`` from 0, and the notes on what mmrl cannot carry are warned and
    kept in the report).
    """
    jsonl_path, media_dir = Path(jsonl_path), Path(image_dir)
    _check_inputs(jsonl_path, media_dir, fmt)
    images = ImageLimits(min_pixels, max_pixels, factor, max_file_bytes, max_source_pixels, sizing)
    videos = video_limits or VideoLimits(min_pixels=min_pixels, frame_max_pixels=max_pixels,
                                         total_max_pixels=8 * max_pixels, factor=factor, sizing=sizing)
    with RowConverter(media_dir, images, videos, data_source_default, count_tokens, max_prompt_tokens) as converter:
        if fmt == "jsonl":
            rows, quarantined, report = convert_lines(jsonl_path.read_bytes().splitlines(), converter,
                                                      jsonl_path.stem)
        else:
            sources, notes = peer_sources(jsonl_path, fmt, split, videos.fps)
            for note in notes:
                warnings.warn(f"{jsonl_path}: {note}", stacklevel=2)
            rows, quarantined, report = convert_records(sources, converter, jsonl_path.stem, total=len(sources),
                                                        row_index=True)
            report.notes = notes
    write_parquet(rows, out_parquet)
    _write_jsonl(quarantined, Path(quarantine_path))
    return report


def convert_splits(source: str | Path, image_dir: str | Path, out_dir: str | Path, *, fmt: str = "jsonl",
                   split: str = "", **options: Any) -> dict[str, ConvertReport]:
    """Convert ``source`` into ``<out_dir>/<split>.parquet`` and ``<split>.quarantine.jsonl`` per split, the report
    of each by the split written (:func:`convert_jsonl` does one; ``options`` are its keywords).

    A DatasetDict folder (``fmt="hf"``) with ``split`` empty writes each of its splits to the file mmrl reads it
    from (``validation`` to ``val``, :mod:`data_prep.splits`); with ``split`` set, that one. Any other input is one
    split: ``split`` (an alias read as mmrl's name), else ``train``. Every split is planned before any is written.
    """
    source, out = Path(source), Path(out_dir)
    names = hf_split_names(source) if fmt == "hf" and source.is_dir() else None
    plan = plan_splits(names, split, str(source))
    return {written: convert_jsonl(source, image_dir, out / f"{written}.parquet", out / f"{written}.quarantine.jsonl",
                                   fmt=fmt, split=read, **options)
            for read, written in plan}
