"""A peer's file as rows of Python values: a parquet file or a ``datasets`` folder read as its stored Arrow table
(images stay ``{"bytes", "path"}`` structs, never decoded here), ``datasets``' Json values parsed, and the columns
a row cannot carry left out and named.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from data_prep.splits import source_split

MEDIA_COLUMNS = ("image", "images", "video", "videos")
JSON_EXTENSION = "arrow.json"  # datasets' Json feature (e.g. chat parts of several shapes) stores JSON text


def read_parquet_table(path: Path, fmt: str) -> Any:
    """The pyarrow table of a parquet file (``fmt`` names the layout in errors)."""
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except Exception as err:  # pyarrow's errors for a file that is not parquet
        raise ValueError(f"{path} cannot be read as a parquet file ({type(err).__name__}: {err}); "
                         f"data.format={fmt} reads parquet") from err


def load_datasets_folder(path: Path) -> Any:
    """The Dataset or DatasetDict saved at ``path``."""
    from datasets import load_from_disk

    try:
        return load_from_disk(str(path))
    except Exception as err:  # datasets raises FileNotFoundError or its own errors for a folder it did not write
        raise ValueError(f"{path} is not a datasets folder ({type(err).__name__}: {err}); write it with "
                         "Dataset.save_to_disk or DatasetDict.save_to_disk") from err


def hf_split_names(path: Path) -> list[str] | None:
    """The splits of the DatasetDict saved at ``path``; None for a single Dataset."""
    from datasets import DatasetDict

    data = load_datasets_folder(path)
    return sorted(data) if isinstance(data, DatasetDict) else None


def hf_table(path: Path, split: str) -> Any:
    """The stored table of the dataset at ``path`` (of a DatasetDict, the ``split`` split)."""
    from datasets import Dataset, DatasetDict

    data = load_datasets_folder(path)
    if isinstance(data, DatasetDict):
        data = data[source_split(list(data), split, str(path))]
    assert isinstance(data, Dataset)
    return data.data.table if data._indices is None else data.flatten_indices().data.table


def table_rows(table: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a pyarrow table, Json values parsed, and notes naming the columns left out: binary data other
    than the media (a row's other columns go to ``extra``, which is JSON text)."""
    dropped = [f.name for f in table.schema if f.name not in MEDIA_COLUMNS and _holds(f.type, _is_binary)]
    note = (f"columns {dropped} hold binary data (images?) and are left out: a row's other columns go to its "
            "extra, which is JSON text; give images in 'images' (or 'image') and videos in 'videos'")
    notes = [note] if dropped else []
    table = table.drop_columns(dropped)
    rows = table.to_pylist()
    for f in table.schema:
        if _holds(f.type, _is_json):
            for row in rows:
                row[f.name] = _json_parsed(row[f.name], f.type)
    return rows, notes


def _is_binary(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)


def _is_json(kind: Any) -> bool:
    return getattr(kind, "extension_name", None) == JSON_EXTENSION


def _children(kind: Any) -> list[tuple[str | None, Any]]:
    """(field name, type) of a struct's fields; (None, item type) of a list's items (a map's keys and items)."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return [(kind.field(i).name, kind.field(i).type) for i in range(kind.num_fields)]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [(None, kind.value_type)]
    if pa.types.is_map(kind):
        return [(None, kind.key_type), (None, kind.item_type)]
    return []


def _holds(kind: Any, test: Callable[[Any], bool]) -> bool:
    """Whether ``test`` holds of a pyarrow type or of any type inside it."""
    return test(kind) or any(_holds(child, test) for _, child in _children(kind))


def _json_parsed(value: Any, kind: Any) -> Any:
    """``value`` of pyarrow type ``kind`` with the JSON text of its Json parts parsed."""
    import pyarrow as pa

    if value is None:
        return None
    if _is_json(kind):
        return json.loads(value) if isinstance(value, str) else value
    if pa.types.is_struct(kind):
        return {name: _json_parsed(value.get(name), child) for name, child in _children(kind)}
    if _children(kind) and isinstance(value, list) and not pa.types.is_map(kind):
        return [_json_parsed(item, kind.value_type) for item in value]
    return value


__all__ = ["MEDIA_COLUMNS", "hf_split_names", "hf_table", "load_datasets_folder", "read_parquet_table", "table_rows"]
