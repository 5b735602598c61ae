"""The peers' data layouts, read into the records :class:`data_prep.records.RowConverter` converts: the same checks,
budgets and quarantine as mmrl's own JSONL.

``data.format`` names the layout of ``data.jsonl`` (a file, or a folder for ``hf``):

- ``verl``: a parquet file with ``prompt`` (chat messages: an optional system message, then one user message whose
  ``<image>`` / ``<video>`` placeholders stand for the media; a content may also be a list of typed parts),
  ``images`` and ``videos``, ``reward_model.ground_truth`` (the answer) and ``data_source`` (the row's; it picks the
  verifier, ``reward.verifiers``, and reaches the reward functions); ``ability``, ``extra_info`` and any other
  column go to ``extra``, where a reward function receives them by name (``extra_info`` as verl passes it);
- ``easyr1``: a parquet file with ``problem`` (the prompt, placeholders as above), ``answer``, ``images``,
  ``videos`` and optionally ``data_source``; the other columns go to ``extra``;
- ``trl``: a parquet file in TRL's vision-language layout (:mod:`data_prep.trl_format`);
- ``hf``: a Hugging Face ``datasets`` folder (``save_to_disk``; of a DatasetDict the split :mod:`data_prep.splits`
  picks), in any layout above (told apart by its columns: ``reward_model`` is verl's, ``problem`` EasyR1's, a chat
  list ``prompt`` or a ``solution`` / ``ground_truth`` column without ``answer`` TRL's) or in mmrl's JSONL fields
  (``prompt``, ``images``, ``answer``).

An image is the encoded bytes, a path relative to the media folder (``data.image_dir``, default the file's
folder), or a ``{"bytes": ..., "path": ...}`` dict (``datasets``' Image feature: the bytes when present, else the
path); a video is a path (or ``{"video": path}``) or a list of frames in those forms, taken at ``data.video_fps``.
A row that cannot be read as its layout says is quarantined with the reason, like a bad JSONL line; its text in
the quarantine file shows bytes as ``<N bytes>``. What a file holds that mmrl cannot carry is named in the
conversion's notes (:class:`PeerTable`; the converter warns them and prints them), never dropped silently: a
column of binary data other than the media (``extra`` is JSON text), a verl column named as one of mmrl's fields
(``answer``: verl's is ``reward_model.ground_truth``), a verl ``reward_model.style`` other than ``rule`` (mmrl's
reward is the config's, for every row).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from data_prep import peer_fields
from data_prep.peer_tables import MEDIA_COLUMNS, hf_table, read_parquet_table, table_rows
from data_prep.rejects import RowRejected
from data_prep.trl_format import ground_truth_column, trl_record

FORMATS = ("jsonl", "verl", "easyr1", "trl", "hf")
PARQUET_FORMATS = ("verl", "easyr1", "trl")
Source = tuple[int, str, Callable[[], dict[str, Any]]]
"""One input record: its line (or row) number, its text as the quarantine file shows it, and a call that returns
the record or raises RowRejected."""


@dataclass
class PeerTable:
    """A peer file's rows, the layout they are in and notes on what mmrl cannot carry of them."""

    rows: list[dict[str, Any]]
    layout: str
    notes: list[str] = field(default_factory=list)


def peer_sources(path: Path, fmt: str, split: str, frame_fps: float) -> tuple[list[Source], list[str]]:
    """Every row of the ``fmt`` file (or folder) at ``path`` as a :data:`Source` (row numbers from 1), and the
    notes on what mmrl cannot carry of it."""
    table = read_rows(path, fmt, split)
    to_record = {"verl": verl_record, "easyr1": easyr1_record, "trl": trl_record, "jsonl": plain_record}[table.layout]
    sources = [(i, peer_fields.shown(row), partial(to_record, row, frame_fps))
               for i, row in enumerate(table.rows, start=1)]
    return sources, table.notes


def read_rows(path: Path, fmt: str, split: str) -> PeerTable:
    """The rows of the file or folder, the layout they are in (``verl``, ``easyr1``, ``trl`` or ``jsonl``'s fields)
    and the notes on what mmrl cannot carry of them (:func:`data_prep.peer_tables.table_rows`)."""
    if fmt in PARQUET_FORMATS:
        table, layout = read_parquet_table(path, fmt), fmt
    elif fmt == "hf":
        table = hf_table(path, split)
        layout = hf_layout(table)
    else:
        raise ValueError(f"data format {fmt!r} has no peer reader; allowed: {', '.join(PARQUET_FORMATS)}, hf")
    rows, notes = table_rows(table)
    return PeerTable(rows, layout, notes + _verl_notes(table.column_names, rows) if layout == "verl" else notes)


def hf_layout(table: Any) -> str:
    """The layout of a datasets table, from its columns (a pyarrow table)."""
    import pyarrow as pa

    columns = set(table.column_names)
    if "reward_model" in columns:
        return "verl"
    if "problem" in columns:
        return "easyr1"
    chat = "prompt" in columns and pa.types.is_list(table.schema.field("prompt").type)
    if chat or ("answer" not in columns and ground_truth_column(columns) is not None):
        return "trl"
    return "jsonl"


def _verl_notes(columns: list[str], rows: list[dict[str, Any]]) -> list[str]:
    """What of a verl file is not used: columns named as mmrl's own fields, a reward style other than rule."""
    notes = []
    unread = [name for name in columns if name in VERL_UNREAD]
    if unread:
        notes.append(f"columns {unread} are not read: a verl row's answer is reward_model.ground_truth, its system "
                     "message the prompt's first; rename them to keep them in extra")
    styles = {r["reward_model"].get("style") for r in rows if isinstance(r.get("reward_model"), dict)} - {"rule", None}
    if styles:
        notes.append(f"reward_model.style {sorted(map(str, styles))} is not used: mmrl scores every row with the "
                     "config's reward (reward.function or reward.weights, reward.model.path for a reward model, "
                     "reward.verifiers per data_source)")
    return notes


# ---- one row of each layout -------------------------------------------------------------------

VERL_COLUMNS = ("prompt", "images", "videos", "reward_model", "id", "data_source")
VERL_UNREAD = ("answer", "system", "image", "video")
"""Columns a verl file may have whose names are mmrl's record fields: not read (and noted)."""


def verl_record(row: dict[str, Any], frame_fps: float) -> dict[str, Any]:
    messages = row.get("prompt")
    if not isinstance(messages, list) or not messages:
        raise RowRejected("missing_field", "verl: 'prompt' must be a non-empty list of chat messages; add it")
    system, user = peer_fields.split_messages(messages, "verl")
    reward = row.get("reward_model")
    if not isinstance(reward, dict) or reward.get("ground_truth") in (None, ""):
        raise RowRejected("missing_field", "verl: 'reward_model.ground_truth' (the answer) is missing; add it")
    extra = {key: value for key, value in row.items()
             if key not in (*VERL_COLUMNS, *VERL_UNREAD) and value not in (None, {})}
    record = {"prompt": user, "answer": peer_fields.scalar(reward["ground_truth"], "reward_model.ground_truth"),
              "images": peer_fields.images(row.get("images")),
              "videos": peer_fields.videos(row.get("videos"), frame_fps), **extra}
    if system:
        record["system"] = system
    for key in ("id", "data_source"):
        if row.get(key) is not None:
            record[key] = row[key]
    return peer_fields.drop_empty(record)


def easyr1_record(row: dict[str, Any], frame_fps: float) -> dict[str, Any]:
    if not isinstance(row.get("problem"), str):
        raise RowRejected("missing_field", "easyr1: 'problem' (the prompt text) is missing or not a string; add it")
    record = {key: value for key, value in row.items() if key not in ("problem", "images", "videos")}
    record |= {"prompt": row["problem"], "images": peer_fields.images(row.get("images")),
               "videos": peer_fields.videos(row.get("videos"), frame_fps)}
    if record.get("answer") is not None:
        record["answer"] = peer_fields.scalar(record["answer"], "answer")
    return peer_fields.drop_empty(record)


def plain_record(row: dict[str, Any], frame_fps: float) -> dict[str, Any]:
    """mmrl's JSONL fields in a datasets folder: media may be bytes or Image-feature dicts too."""
    record = {key: value for key, value in row.items() if not (key in MEDIA_COLUMNS and value is None)}
    readers = (("image", "images", peer_fields.images), ("video", "videos",
                                                         partial(peer_fields.videos, frame_fps=frame_fps)))
    for one, many, read in readers:
        if one in record:
            record[many] = read([record.pop(one)])
        elif many in record:
            record[many] = read(record[many])
    return peer_fields.drop_empty(record)


__all__ = ["FORMATS", "PeerTable", "Source", "hf_layout", "peer_sources", "read_rows"]
