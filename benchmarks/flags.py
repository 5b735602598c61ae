"""A benchmark's own command-line flags, beside every stage's ``--config FILE`` and overrides.

A benchmark's command line is a stage's (:mod:`pipelines.cli`) plus flags of its own (the sizes to run, the
sides to compare), which :func:`parse_flags` reads first; ``--help`` lists them. The Makefile passes them from
make variables (``make bench-scale SIDES="mmrl trl"``). A list flag takes its items separated by spaces or
commas.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from pipelines.cli import Command, parse_command

STAGE_ARGUMENTS = ("Also takes what every stage takes: --config FILE and section.key=value overrides "
                   "(e.g. rollout.n=8).")


def parse_flags(parser: argparse.ArgumentParser,
                argv: list[str] | None = None) -> tuple[Command, argparse.Namespace]:
    """The benchmark's own flags (``parser``'s), then the stage's command line from the other arguments."""
    if parser.epilog is None:
        parser.epilog = STAGE_ARGUMENTS
    flags, rest = parser.parse_known_args(argv)
    return parse_command(parser.description or "", rest), flags


def flag_list(text: str) -> list[str]:
    """A flag's items, separated by spaces or commas: ``"trl mmrl"``, ``trl,mmrl``."""
    return text.replace(",", " ").split()


def shapes(parts: int, example: str) -> Callable[[str], list[tuple[int, ...]]]:
    """An argparse type: a list of shapes, each ``parts`` positive integers joined by ``x`` (``example``)."""

    def parse(text: str) -> list[tuple[int, ...]]:
        try:
            out = [tuple(int(n) for n in item.split("x")) for item in flag_list(text)]
        except ValueError:
            out = []
        if not out or any(len(shape) != parts or min(shape) < 1 for shape in out):
            raise argparse.ArgumentTypeError(f"{text!r}: give shapes like {example!r}")
        return out

    return parse


def names(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type: a non-empty list of names, each one of ``allowed``."""

    def parse(text: str) -> list[str]:
        out = flag_list(text)
        unknown = [name for name in out if name not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; allowed: {', '.join(allowed)}")
        if not out:
            raise argparse.ArgumentTypeError(f"give at least one of {', '.join(allowed)}")
        return out

    return parse
