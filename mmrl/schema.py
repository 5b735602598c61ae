"""Row schema of every prompt parquet file: its columns, the media placeholders, :class:`Video`, reading.

Data prep (``data_prep``) writes the files (:func:`data_prep.parquet.write_parquet`); the library reads them.
Both import the schema from here, so the library never imports its preprocessing package.

Each row has these columns:

    id (str)
        Unique row id.
    messages (list of {"role": str, "content": str})
        Chat messages. The user content holds one ``<image>`` placeholder per
        image, at the place the image goes, e.g. ``"<image>What colour is the
        shape?"``.
    images (list of binary)
        PNG-encoded image bytes, already resized to the pixel budget, in the
        order of the placeholders.
    videos (list of {"frames": list of binary, "timestamps": list of float})
        One entry per ``<video>`` placeholder, in order: the frames sampled
        from the video (PNG, all one size, within the pixel budgets) and
        their times in seconds. No training step decodes a video file again.
    answer (str)
        The ground truth.
    data_source (str)
        Where the row comes from, e.g. ``"synthetic/colour"``,
        ``"synthetic/count"`` or a user's own name.
    extra (str)
        A JSON object string with the row's other fields (may be ``"{}"``).
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

if TYPE_CHECKING:
    import datasets

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"

COLUMNS: tuple[str, ...] = ("id", "messages", "images", "videos", "answer", "data_source", "extra")


@dataclass(frozen=True)
class Video:
    """A decoded video: its sampled frames (RGB PIL images, one size) and their times in seconds."""

    frames: list[Image.Image]
    timestamps: list[float]

    @property
    def fps(self) -> float:
        """The rate of the stored frames (what the model's temporal positions use); 1.0 for one frame."""
        if len(self.timestamps) < 2 or self.timestamps[-1] <= self.timestamps[0]:
            return 1.0
        return (len(self.timestamps) - 1) / (self.timestamps[-1] - self.timestamps[0])


@functools.cache
def features() -> datasets.Features:
    """The parquet schema as ``datasets.Features`` (imported on first use: ``datasets`` takes ~2 s to load)."""
    import datasets

    return datasets.Features(
        {
            "id": datasets.Value("string"),
            "messages": datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")}),
            "images": datasets.List(datasets.Value("binary")),
            "videos": datasets.List(
                {"frames": datasets.List(datasets.Value("binary")), "timestamps": datasets.List(datasets.Value("float64"))}
            ),
            "answer": datasets.Value("string"),
            "data_source": datasets.Value("string"),
            "extra": datasets.Value("string"),
        }
    )


def make_row(
    row_id: str,
    prompt: str,
    images: list[bytes],
    answer: str,
    data_source: str,
    extra: Mapping[str, Any] | None = None,
    videos: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Build a schema row holding a single user message."""
    return {
        "id": row_id,
        "messages": [{"role": "user", "content": prompt}],
        "images": list(images),
        "videos": [{"frames": list(v["frames"]), "timestamps": [float(t) for t in v["timestamps"]]} for v in videos],
        "answer": answer,
        "data_source": data_source,
        "extra": json.dumps(dict(extra or {}), sort_keys=True, ensure_ascii=False),
    }


def count_placeholders(messages: Sequence[Mapping[str, Any]], placeholder: str = IMAGE_PLACEHOLDER) -> int:
    """Number of ``placeholder`` s (``<image>`` by default) over the string contents of ``messages``."""
    return sum(m["content"].count(placeholder) for m in messages if isinstance(m["content"], str))


def validate_row(row: Mapping[str, Any]) -> None:
    """Raise ValueError if a row breaks the schema's invariants."""
    row_id = row.get("id", "<no id>")
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise ValueError(f"row {row_id!r} lacks columns {missing}; every row needs {list(COLUMNS)}")
    for placeholder, column in ((IMAGE_PLACEHOLDER, "images"), (VIDEO_PLACEHOLDER, "videos")):
        found = count_placeholders(row["messages"], placeholder)
        if found != len(row[column]):
            raise ValueError(
                f"row {row_id!r} has {found} {placeholder} placeholders but {len(row[column])} {column}; put "
                f"exactly one placeholder per {column[:-1]}"
            )
    for video in row["videos"]:
        times = list(video["timestamps"])
        if not video["frames"] or len(times) != len(video["frames"]) or times != sorted(times):
            raise ValueError(f"row {row_id!r}: a video needs one or more frames, one timestamp per frame, in order")
    if not isinstance(json.loads(row["extra"]), dict):
        raise ValueError(f"row {row_id!r}: extra must be a JSON object string such as '{{}}'")


def read_parquet(path: str | Path) -> datasets.Dataset:
    """Read a prompt parquet file into memory and check it has the schema's columns.

    Reads through pyarrow rather than ``Dataset.from_parquet`` so no copy is
    left in the datasets cache (a stale cache could hide a rewritten file).
    """
    import datasets
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"parquet file {path} does not exist; write it first (make data, or data_prep.parquet.write_parquet)")
    table = pq.read_table(path)
    if "videos" not in table.column_names:  # written before videos existed: no row has one
        import pyarrow as pa

        table = table.append_column("videos", pa.array([[]] * table.num_rows, features().arrow_schema.field("videos").type))
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path} lacks columns {missing}; regenerate it with data_prep.parquet.write_parquet")
    dataset = datasets.Dataset(table.select(list(COLUMNS)))
    return dataset if dataset.features == features() else dataset.cast(features())


def decode_image(data: bytes) -> Image.Image:
    """Decode one image's bytes (PNG as written by data prep) into an RGB PIL image."""
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def decode_images(row: Mapping[str, Any]) -> list[Image.Image]:
    """Decode a row's PNG bytes into RGB PIL images."""
    return [decode_image(data) for data in row["images"]]


def decode_video(video: Mapping[str, Any]) -> Video:
    """One stored video (frames as PNG bytes, timestamps) as a :class:`Video`."""
    return Video(frames=[decode_image(f) for f in video["frames"]], timestamps=[float(t) for t in video["timestamps"]])
