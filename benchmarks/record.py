"""A benchmark's stored record (``results/bench/<name>.json``) and the docs' block rendered from it alone.

A bench that stores its run writes a record (the command, the commit, the machine, the work, the numbers) and
renders a block of docs/performance.md from that record only, between two markers; ``--render`` renders it again
and ``--check`` (and a unit test) says whether the docs still show the stored record.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs/performance.md"
NUMBERS = re.compile(r"\[\s+((?:-?[\d.eE+-]+|null)(?:,\s+(?:-?[\d.eE+-]+|null))*)\s+\]")


def dump_record(record: dict[str, Any]) -> str:
    """``record`` as JSON, one key a line, a list of numbers on one line (a diff shows which value moved)."""
    text = json.dumps(record, indent=1)
    return NUMBERS.sub(lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text) + "\n"


def load_record(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def commit_text(record: dict[str, Any]) -> str:
    """The record's commit, short, with ``+dirty`` when the tree had changes."""
    return record["commit"][:7] + ("+dirty" if record["commit"].endswith("+dirty") else "")


@dataclass(frozen=True)
class Block:
    """The part of the docs between ``begin`` and ``end`` (both lines kept) that one record renders."""

    begin: str
    end: str

    def replace(self, text: str, block: str) -> str:
        """``text`` with the part from ``begin`` to ``end`` (both included) replaced by ``block``."""
        start, stop = text.find(self.begin), text.find(self.end)
        if start < 0 or stop < start:
            raise ValueError(f"the docs have no generated block: add the lines {self.begin!r} and {self.end!r}")
        return text[:start] + block + text[stop + len(self.end):]

    def write(self, block: str, doc: Path = DOC) -> bool:
        """Put ``block`` into ``doc``; True when that changed it."""
        before = doc.read_text()
        after = self.replace(before, block)
        if after != before:
            doc.write_text(after)
        return after != before

    def stale(self, block: str, doc: Path = DOC) -> bool:
        """Whether ``doc`` shows something else than ``block``."""
        text = doc.read_text()
        return self.replace(text, block) != text
