"""The peers' data layouts, read into the records :class:`data_prep.records.RowConverter` converts: the same checks,
budgets and quarantine as mmrl's own JSONL.

``data.format`` names the layout of ``data.jsonl`` (a file, or a folder for ``hf``):

- ``verl``: a parquet file with ``prompt`` (chat messages: an optional system message, then one user message whose
  ``<image>`` / ``<video>`` placeholders stand for the media; a content may also be a list of typed parts),
  ``images`` and ``videos``, ``reward_model.ground_truth`` (the answer), ``data_source``, ``ability`` and
  ``extra_info`` (both kept in ``extra``);
- ``easyr1``: a parquet file with ``problem`` (the prompt, placeholders as above), ``answer``, ``images``,
  ``videos`` and optionally ``data_source``; the other columns go to ``extra``;
- ``hf``: a Hugging Face ``datasets`` folder (``save_to_disk``; of a DatasetDict the ``data.split`` split), in
  either layout above (told apart by its columns: ``problem`` is EasyR1's, ``reward_model`` verl's) or in mmrl's
  JSONL fields (``prompt``, ``images``, ``answer``).

An image is the encoded bytes, a path relative to the media folder (``data.image_dir``, default the file's
folder), or a ``{"bytes": ..., "path": ...}`` dict (``datasets``' Image feature: the bytes when present, else the
path); a video is a path (or ``{"video": path}``) or a list of frames in those forms, taken at ``data.video_fps``.
A row that cannot be read as its layout says is quarantined with the reason, like a bad JSONL line; its text in
the quarantine file shows bytes as ``<N bytes>``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from data_prep.records import FrameList, InlineImage, MediaItem
from data_prep.rejects import RowRejected

FORMATS = ("jsonl", "verl", "easyr1", "hf")
Source = tuple[int, str, Callable[[], dict[str, Any]]]
"""One input record: its line (or row) number, its text as the quarantine file shows it, and a call that returns
the record or raises RowRejected."""


def peer_sources(path: Path, fmt: str, split: str, frame_fps: float) -> list[Source]:
    """Every row of the ``fmt`` file (or folder) at ``path`` as a :data:`Source` (row numbers from 1)."""
    rows, layout = read_rows(path, fmt, split)
    to_record = {"verl": verl_record, "easyr1": easyr1_record, "jsonl": plain_record}[layout]
    return [(i, _shown(row), partial(to_record, row, frame_fps)) for i, row in enumerate(rows, start=1)]


def read_rows(path: Path, fmt: str, split: str) -> tuple[list[dict[str, Any]], str]:
    """The rows of the file or folder and the layout they are in (``verl``, ``easyr1`` or ``jsonl``'s fields)."""
    if fmt in ("verl", "easyr1"):
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist(), fmt
        except Exception as err:  # pyarrow's errors for a file that is not parquet
            raise ValueError(f"{path} cannot be read as a parquet file ({type(err).__name__}: {err}); "
                             f"data.format={fmt} reads parquet") from err
    if fmt == "hf":
        return _hf_rows(path, split)
    raise ValueError(f"data format {fmt!r} has no peer reader; allowed: verl, easyr1, hf")


def _hf_rows(path: Path, split: str) -> tuple[list[dict[str, Any]], str]:
    from datasets import Dataset, DatasetDict, load_from_disk

    try:
        data = load_from_disk(str(path))
    except Exception as err:  # datasets raises FileNotFoundError or its own errors for a folder it did not write
        raise ValueError(f"{path} is not a datasets folder ({type(err).__name__}: {err}); write it with "
                         "Dataset.save_to_disk or DatasetDict.save_to_disk") from err
    if isinstance(data, DatasetDict):
        if split not in data:
            raise ValueError(f"{path} holds the splits {sorted(data)}, not data.split={split!r}; set data.split")
        data = data[split]
    assert isinstance(data, Dataset)
    columns = set(data.column_names)
    layout = "easyr1" if "problem" in columns else "verl" if "reward_model" in columns else "jsonl"
    # The stored table: images stay {"bytes", "path"} structs instead of being decoded into PIL images.
    table = data.data.table if data._indices is None else data.flatten_indices().data.table
    return table.to_pylist(), layout


# ---- one row of each layout -------------------------------------------------------------------


def verl_record(row: dict[str, Any], frame_fps: float) -> dict[str, Any]:
    messages = row.get("prompt")
    if not isinstance(messages, list) or not messages:
        raise RowRejected("missing_field", "verl: 'prompt' must be a non-empty list of chat messages; add it")
    system, user = _split_messages(messages)
    reward = row.get("reward_model")
    if not isinstance(reward, dict) or reward.get("ground_truth") in (None, ""):
        raise RowRejected("missing_field", "verl: 'reward_model.ground_truth' (the answer) is missing; add it")
    extra = {key: row[key] for key in ("ability", "extra_info") if row.get(key) not in (None, {})}
    record = {"prompt": user, "answer": _scalar(reward["ground_truth"], "reward_model.ground_truth"),
              "images": _images(row.get("images")), "videos": _videos(row.get("videos"), frame_fps), **extra}
    if system:
        record["system"] = system
    for key in ("id", "data_source"):
        if row.get(key) is not None:
            record[key] = row[key]
    return _drop_empty(record)


def easyr1_record(row: dict[str, Any], frame_fps: float) -> dict[str, Any]:
    if not isinstance(row.get("problem"), str):
        raise RowRejected("missing_field", "easyr1: 'problem' (the prompt text) is missing or not a string; add it")
    record = {key: value for key, value in row.items() if key not in ("problem", "images", "videos")}
    record |= {"prompt": row["problem"], "images": _images(row.get("images")),
               "videos": _videos(row.get("videos"), frame_fps)}
    if record.get("answer") is not None:
        record["answer"] = _scalar(record["answer"], "answer")
    return _drop_empty(record)


def plain_record(row: dict[str, Any], frame_fps: float) -> dict[str, Any]:
    """mmrl's JSONL fields in a datasets folder: media may be bytes or Image-feature dicts too."""
    record = dict(row)
    for one, many, read in (("image", "images", _images), ("video", "videos", partial(_videos, frame_fps=frame_fps))):
        if one in record:
            record[many] = read([record.pop(one)])
        elif many in record:
            record[many] = read(record[many])
    return _drop_empty(record)


def _split_messages(messages: list[Any]) -> tuple[str, str]:
    """(system text, user text) of a single-turn prompt."""
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if roles not in (["user"], ["system", "user"]):
        raise RowRejected("bad_field", f"verl: 'prompt' has the roles {roles}; mmrl's prompts are single-turn, an "
                                       "optional system message then one user message")
    texts = [_content_text(m.get("content")) for m in messages]
    return (texts[0] if len(texts) == 2 else ""), texts[-1]


def _content_text(content: Any) -> str:
    """A message content as text: a string, or typed parts whose images and videos become placeholders."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            elif kind in ("image", "video"):
                pieces.append(f"<{kind}>")
            else:
                raise RowRejected("bad_field", f"a content part {str(part)[:80]!r} is not a text, image or video part")
        return "".join(pieces)
    raise RowRejected("bad_field", f"a message content is {type(content).__name__}; write a string or typed parts")


def _scalar(value: Any, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RowRejected("bad_field", f"{name!r} is {type(value).__name__}; mmrl's verifiers compare one answer "
                                       "string: write it as a string")
    return str(value)


def _images(items: Any) -> list[MediaItem]:
    if items is None:
        return []
    if not isinstance(items, (list, tuple)):
        raise RowRejected("bad_field", f"'images' is {type(items).__name__}; give a list of images")
    return [_image(item, f"images[{i}]") for i, item in enumerate(items)]


def _image(item: Any, name: str) -> str | InlineImage:
    if isinstance(item, (bytes, bytearray)):
        return InlineImage(bytes(item), name)
    if isinstance(item, str) and item:
        return item
    if isinstance(item, dict):
        if item.get("bytes"):
            return InlineImage(bytes(item["bytes"]), item.get("path") or name)
        if isinstance(item.get("path"), str) and item["path"]:
            return item["path"]
    raise RowRejected("bad_field", f"{name} is {_shown(item)[:80]}; give the image's bytes, a path, or "
                                   "{'bytes': ..., 'path': ...}")


def _videos(items: Any, frame_fps: float) -> list[MediaItem]:
    if items is None:
        return []
    if not isinstance(items, (list, tuple)):
        raise RowRejected("bad_field", f"'videos' is {type(items).__name__}; give a list of videos")
    videos: list[MediaItem] = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("video"), str):
            item = item["video"]
        if isinstance(item, str) and item:
            videos.append(item)
        elif isinstance(item, (list, tuple)):
            videos.append(FrameList(tuple(_image(f, f"videos[{i}][{j}]") for j, f in enumerate(item)), frame_fps))
        else:
            raise RowRejected("bad_field", f"videos[{i}] is {_shown(item)[:80]}; give a path or a list of frames")
    return videos


def _drop_empty(record: dict[str, Any]) -> dict[str, Any]:
    """Without empty media lists (the converter refuses a present but empty ``images``)."""
    return {k: v for k, v in record.items() if not (k in ("images", "videos") and v == [])}


def _shown(value: Any) -> str:
    """A row as JSON text for the quarantine file, bytes shown as ``<N bytes>``."""
    def default(item: Any) -> Any:
        if isinstance(item, (bytes, bytearray)):
            return f"<{len(item)} bytes>"
        return str(item)

    try:
        return json.dumps(value, default=default, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)[:2000]


__all__ = ["FORMATS", "Source", "peer_sources", "read_rows"]
