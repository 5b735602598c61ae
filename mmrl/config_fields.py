"""The pieces a config section is written with: bounded numeric fields, the error a bad key raises, and the
dataclass that gathers the sections of a table.

A leaf module: :mod:`mmrl.config` and the sections declared beside their owners (each loss's in its module
under :mod:`mmrl.algos.losses`, each algorithm's in its module under :mod:`mmrl.algos`) both import it, so
that the config can gather those sections from the tables without an import circle.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A config key or value that cannot be used; the message names the key and the fix."""


@dataclass(frozen=True)
class Bounds:
    """The allowed range of a numeric field; ``None`` leaves that side open."""

    gt: float | None = None
    ge: float | None = None
    le: float | None = None

    def violation(self, value: float) -> str | None:
        """What is wrong with ``value`` (NaN and inf included), or None when it is allowed."""
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        if self.gt is not None and not value > self.gt:
            return f"must be > {self.gt:g}"
        if self.ge is not None and not value >= self.ge:
            return f"must be >= {self.ge:g}"
        if self.le is not None and not value <= self.le:
            return f"must be <= {self.le:g}"
        return None


def num(default: float, *, gt: float | None = None, ge: float | None = None, le: float | None = None) -> Any:
    """A numeric config field with its allowed range, checked at load time."""
    return field(default=default, metadata={"bounds": Bounds(gt=gt, ge=ge, le=le)})


def auto_size() -> Any:
    """A micro-batch size (rows or tokens): >= 0, where 0, also spelt ``auto``, leaves it to the worker, which
    sizes a token budget from its model and memory (:mod:`mmrl.memory.budget`)."""
    return field(default=0, metadata={"bounds": Bounds(ge=0), "auto": True})


def gather_sections(name: str, sections: Mapping[str, type | None], base: type, module: str) -> type:
    """A dataclass ``name`` (keyword-only) that extends ``base`` with one field per entry of ``sections``: the
    section's dataclass under its table name, built by default. An entry without a section (None) gets no field.
    The class is named ``module.name``, where the caller binds it, so that it pickles by reference; its
    docstring is ``base``'s."""
    clash = sorted(key for key, section in sections.items()
                   if section is not None and key in {f.name for f in dataclasses.fields(base)})
    if clash:
        raise ValueError(f"{name}: section names {clash} are keys of {base.__name__} already")
    gathered = dataclasses.make_dataclass(
        name, [(key, section, field(default_factory=section)) for key, section in sections.items() if section],
        bases=(base,), kw_only=True)
    gathered.__module__, gathered.__qualname__, gathered.__doc__ = module, name, base.__doc__
    return gathered
