"""Preference pairs, the reward model's training data: (prompt, chosen response, rejected response).

A pairs file is JSON lines, one pair per line: ``{"prompt_id": <id of a row of the split>, "chosen": str,
"rejected": str}``; ``kind`` is optional. ``make rm`` writes synthetic ones when none are given
(:mod:`data_prep.preferences`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PreferencePair:
    prompt_id: str
    chosen: str
    rejected: str
    kind: str = ""
    """How the pair was made (``wrong_answer``, ``bad_format``), for per-kind accuracy; empty when unknown."""


def read_pairs(path: Path, known_ids: set[str]) -> list[PreferencePair]:
    """The pairs of a JSON-lines file; a bad line raises ValueError naming it and what to fix."""
    pairs = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where} is not JSON ({err}); write one object per line") from err
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected an object with prompt_id, chosen, rejected")
        missing = [k for k in ("prompt_id", "chosen", "rejected") if not isinstance(item.get(k), str)]
        if missing:
            raise ValueError(f"{where}: {', '.join(missing)} missing or not a string; each pair needs "
                             "prompt_id, chosen and rejected as strings")
        if item["prompt_id"] not in known_ids:
            raise ValueError(f"{where}: prompt_id {item['prompt_id']!r} is not a row id of the split; "
                             "pairs refer to prompts by the id column of the data-prep parquet")
        if item["chosen"] == item["rejected"]:
            raise ValueError(f"{where}: chosen and rejected are the same text; a pair must differ")
        pairs.append(PreferencePair(item["prompt_id"], item["chosen"], item["rejected"], str(item.get("kind", ""))))
    if not pairs:
        raise ValueError(f"{path} holds no pairs")
    return pairs
