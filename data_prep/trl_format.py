"""TRL's vision-language layout (``data.format=trl``): the dataset a ``GRPOTrainer`` takes, read as one record.

- ``prompt``: conversational, a list of chat messages (an optional system message, then one user message) whose
  content is a string or typed parts (``{"type": "image"}``, ``{"type": "text", "text": ...}``); or standard, one
  string. An image part stands where its image goes; a prompt with fewer image parts than images gets the others
  first, as TRL's trainer puts them;
- ``image`` (one image) or ``images`` (a list), as ``datasets``' Image feature, bytes or paths; ``video`` /
  ``videos`` likewise (:func:`data_prep.peer_fields.videos`);
- the ground truth: TRL passes every column to the reward functions, so it has no fixed name; mmrl takes the first
  of :data:`GROUND_TRUTH_COLUMNS` the file has and keeps the others in ``extra``, where the reward functions
  receive them by name.
"""

from __future__ import annotations

from typing import Any

from data_prep import peer_fields
from data_prep.peer_tables import MEDIA_COLUMNS
from data_prep.rejects import RowRejected

GROUND_TRUTH_COLUMNS = ("answer", "solution", "ground_truth")
"""The columns read as a TRL row's answer, in this order of preference."""


def ground_truth_column(columns: list[str] | set[str]) -> str | None:
    """The column a TRL file's answers are read from (None: it has none)."""
    return next((name for name in GROUND_TRUTH_COLUMNS if name in columns), None)


def trl_record(row: dict[str, Any], frame_fps: float) -> dict[str, Any]:
    """One TRL row as a record for :class:`data_prep.records.RowConverter`."""
    system, user = _prompt(row.get("prompt"))
    truth = ground_truth_column(set(row))
    if truth is None:
        raise RowRejected("missing_field", f"trl: the row has no ground truth; mmrl reads it from a column named one "
                                           f"of {list(GROUND_TRUTH_COLUMNS)}: add or rename it")
    if row[truth] in (None, ""):
        raise RowRejected("missing_field", f"trl: {truth!r} (the answer) is missing or empty; add it")
    record = {key: value for key, value in row.items() if key not in ("prompt", truth, *MEDIA_COLUMNS)}
    (images, image_column), (videos, video_column) = _media(row, "image"), _media(row, "video")
    record |= {"prompt": user, "answer": peer_fields.scalar(row[truth], truth),
               "images": peer_fields.images(images, image_column),
               "videos": peer_fields.videos(videos, frame_fps, video_column)}
    if system:
        record["system"] = system
    return peer_fields.drop_empty(record)


def _prompt(prompt: Any) -> tuple[str, str]:
    if isinstance(prompt, str) and prompt:
        return "", prompt
    if isinstance(prompt, list) and prompt:
        return peer_fields.split_messages(prompt, "trl")
    raise RowRejected("missing_field", "trl: 'prompt' must be a non-empty string or list of chat messages; add it")


def _media(row: dict[str, Any], kind: str) -> tuple[list[Any] | None, str]:
    """(items, column) of the row's ``kind`` media: its one-item column (``image``) or its list column
    (``images``)."""
    one, many = row.get(kind), row.get(f"{kind}s")
    if one is not None and many is not None:
        raise RowRejected("bad_field", f"trl: both {kind!r} and {kind + 's'!r} are given; keep only one")
    return ([one], kind) if one is not None else (many, f"{kind}s")


__all__ = ["GROUND_TRUTH_COLUMNS", "ground_truth_column", "trl_record"]
