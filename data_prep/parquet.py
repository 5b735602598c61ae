"""Writing prompt parquet files (the schema and reading are the library's: :mod:`mmrl.schema`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mmrl.schema import COLUMNS, features, validate_row


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Validate ``rows`` and write them to a parquet file, creating parent dirs. The file is written under
    a temporary name and renamed, so a crash never leaves a half-written ``path``."""
    seen: set[str] = set()
    for row in rows:
        validate_row(row)
        if row["id"] in seen:
            raise ValueError(f"row id {row['id']!r} occurs twice; ids must be unique")
        seen.add(row["id"])
    import datasets

    if rows:
        dataset = datasets.Dataset.from_list(rows, features=features())
    else:  # from_list cannot infer an empty table's columns
        dataset = datasets.Dataset.from_dict({c: [] for c in COLUMNS}, features=features())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    dataset.to_parquet(str(tmp))
    os.replace(tmp, path)
