"""The fields the peers' layouts share, read into a record's values: chat messages, answers, images and videos.

Each reader raises :class:`~data_prep.rejects.RowRejected` for a value that is not what its layout says, so the
row is quarantined with the reason (:mod:`data_prep.peer_formats`, :mod:`data_prep.trl_format`).
"""

from __future__ import annotations

import json
from typing import Any

from data_prep.records import FrameList, InlineImage, MediaItem
from data_prep.rejects import RowRejected


def split_messages(messages: list[Any], layout: str) -> tuple[str, str]:
    """(system text, user text) of a single-turn chat prompt: an optional system message, then one user message."""
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if roles not in (["user"], ["system", "user"]):
        raise RowRejected("bad_field", f"{layout}: 'prompt' has the roles {roles}; mmrl's prompts are single-turn, an "
                                       "optional system message then one user message")
    texts = [content_text(m.get("content")) for m in messages]
    return (texts[0] if len(texts) == 2 else ""), texts[-1]


def content_text(content: Any) -> str:
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


def scalar(value: Any, name: str) -> str:
    """An answer as the one string mmrl's verifiers compare."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RowRejected("bad_field", f"{name!r} is {type(value).__name__}; mmrl's verifiers compare one answer "
                                       "string: write it as a string")
    return str(value)


def images(items: Any, name: str = "images") -> list[MediaItem]:
    """A list of images (None: none)."""
    if items is None:
        return []
    if not isinstance(items, (list, tuple)):
        raise RowRejected("bad_field", f"{name!r} is {type(items).__name__}; give a list of images")
    return [image(item, f"{name}[{i}]") for i, item in enumerate(items)]


def image(item: Any, name: str) -> str | InlineImage:
    """One image: its encoded bytes, a path, or ``datasets``' Image feature ``{"bytes": ..., "path": ...}``."""
    if isinstance(item, (bytes, bytearray)):
        return InlineImage(bytes(item), name)
    if isinstance(item, str) and item:
        return item
    if isinstance(item, dict):
        if item.get("bytes"):
            return InlineImage(bytes(item["bytes"]), item.get("path") or name)
        if isinstance(item.get("path"), str) and item["path"]:
            return item["path"]
    raise RowRejected("bad_field", f"{name} is {shown(item)[:80]}; give the image's bytes, a path, or "
                                   "{'bytes': ..., 'path': ...}")


def videos(items: Any, frame_fps: float, name: str = "videos") -> list[MediaItem]:
    """A list of videos (None: none), each a path, ``{"video": path}`` or a list of frames taken at ``frame_fps``."""
    if items is None:
        return []
    if not isinstance(items, (list, tuple)):
        raise RowRejected("bad_field", f"{name!r} is {type(items).__name__}; give a list of videos")
    found: list[MediaItem] = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("video"), str):
            item = item["video"]
        if isinstance(item, str) and item:
            found.append(item)
        elif isinstance(item, (list, tuple)):
            found.append(FrameList(tuple(image(f, f"{name}[{i}][{j}]") for j, f in enumerate(item)), frame_fps))
        else:
            raise RowRejected("bad_field", f"{name}[{i}] is {shown(item)[:80]}; give a path or a list of frames")
    return found


def drop_empty(record: dict[str, Any]) -> dict[str, Any]:
    """Without empty media lists (the converter refuses a present but empty ``images``)."""
    return {k: v for k, v in record.items() if not (k in ("images", "videos") and v == [])}


def shown(value: Any) -> str:
    """A row as JSON text for the quarantine file, bytes shown as ``<N bytes>``."""
    def default(item: Any) -> Any:
        if isinstance(item, (bytes, bytearray)):
            return f"<{len(item)} bytes>"
        return str(item)

    try:
        return json.dumps(value, default=default, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)[:2000]
