"""What a tool worker process does with a call: the runner of :mod:`mmrl.plugins.pool` for agent tools.

The driver sends :class:`ToolInput` items under a tool spec; the worker resolves the spec once
(:func:`resolve`), calls the function with the call's arguments and the context keywords it takes
(:data:`mmrl.agent.schemas.CONTEXT_KEYWORDS`), and reports each call's :class:`~mmrl.plugins.outcome.Outcome`:
the result as plain data (:func:`mmrl.agent.outputs.to_plain`) or its failure. A tool known not to take
``images`` is sent none (the pool drops them: :data:`BULKY_FIELDS`).

Every limit that needs another process (a timeout with the GIL held, a crash, memory) is the pool's.
Imports stay light: PIL and the tool's own.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmrl.agent.outputs import ToolLimits, to_plain
from mmrl.agent.registry import resolve
from mmrl.agent.schemas import CONTEXT_KEYWORDS, schema_of
from mmrl.plugins.outcome import Emit, Outcome, raised, timed_out

NOUN = "tool"
BULKY_FIELDS = ("images",)

__all__ = ["BULKY_FIELDS", "NOUN", "ToolInput", "execute", "fields_read", "resolve"]


@dataclass(frozen=True)
class ToolInput:
    """One call of a tool: its arguments (checked against its schema) and the episode it acts on."""

    arguments: dict = field(default_factory=dict)
    images: list = field(default_factory=list)  # the episode's RGB PIL images so far, as stored
    model_image_sizes: list = field(default_factory=list)  # per image, the (width, height) the model saw
    limits: ToolLimits = ToolLimits()
    describe: bool = False  # ask for the tool's schema (as JSON text) instead of calling it


def takes(fn: Callable[..., Any]) -> frozenset[str]:
    """The context keywords ``fn`` takes (all of them with ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return frozenset(CONTEXT_KEYWORDS)
    return frozenset(p.name for p in params if p.name in CONTEXT_KEYWORDS)


def fields_read(fn: Callable[..., Any]) -> tuple[str, ...]:
    """Which of :data:`BULKY_FIELDS` a call of ``fn`` reads."""
    return ("images",) if "images" in takes(fn) else ()


def execute(fn: Callable[..., Any], items: Sequence[tuple[int, ToolInput]], timeout_s: float, emit: Emit) -> None:
    """Call ``fn`` on each item in turn, reporting ("start", index) and ("done", index, Outcome); never raises.
    A call that returns after ``timeout_s`` is a timeout; one that never returns is the pool's to stop."""
    context = takes(fn)
    for index, inp in items:
        emit(("start", index))
        start = time.monotonic()
        try:
            if inp.describe:
                outcome = Outcome(value=json.dumps(schema_of(fn)))
            else:
                values = {"images": inp.images, "model_image_sizes": inp.model_image_sizes,
                          "max_pixels": inp.limits.max_pixels}
                result = fn(**inp.arguments, **{name: values[name] for name in context})
                late = time.monotonic() - start > timeout_s
                outcome = timed_out(timeout_s) if late else to_plain(result, inp.limits)
        except BaseException as exc:  # the tool's failure is this call's, whatever it is
            outcome = raised(exc)
        emit(("done", index, outcome))
