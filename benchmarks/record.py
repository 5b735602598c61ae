"""A benchmark's stored record (``results/bench/<name>.json``) and the docs' block rendered from it alone.

A bench that stores its run writes a record (the command, the commit, the machine, the work, the numbers) and
renders a block of docs/performance.md from that record only, between two markers; ``--render`` renders it again
and ``--check`` (and a unit test) says whether the docs still show the stored record.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
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


@dataclass(frozen=True)
class StoredBench:
    """A bench (``make <name>``, ``python -m benchmarks.<module>``) whose run is stored at ``record`` and rendered
    (by ``render``) into ``block`` of the docs."""

    name: str
    module: str
    record: Path
    block: Block
    render: Callable[[dict[str, Any]], str]

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """``--record``, ``--render`` and ``--check``."""
        parser.add_argument("--record", type=Path, default=self.record,
                            help="where the run's record goes; the default is the stored one the docs are rendered "
                                 "from, and only a run stored there re-renders them (default: %(default)s)")
        parser.add_argument("--render", action="store_true",
                            help="only render docs/performance.md from the stored record")
        parser.add_argument("--check", action="store_true",
                            help="exit 1 when docs/performance.md does not show the stored record")

    def docs_only(self, check: bool, render: bool) -> int | None:
        """``--check`` (1 when the docs do not show the stored record) or ``--render``; None: neither was asked."""
        if check:
            stale = self.block.stale(self.render(load_record(self.record)))
            if stale:
                print(f"docs/performance.md: its {self.name} tables differ from {self.record.relative_to(ROOT)}: "
                      f"run `python -m benchmarks.{self.module} --render`",
                      file=sys.stderr)
            return int(stale)
        if render:
            changed = self.block.write(self.render(load_record(self.record)))
            print(f"docs/performance.md: {'rendered' if changed else 'up to date'}")
            return 0
        return None

    def store(self, record: dict[str, Any], path: Path) -> None:
        """Write ``record`` to ``path``; when that is the stored record's path, render it into the docs."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump_record(record))
        print(f"{self.name}: wrote {path}")
        if path.resolve() == self.record.resolve():
            self.block.write(self.render(record))
            print(f"{self.name}: rendered docs/performance.md")
