"""What one call of a plugin on one sample produced, and how a runner reports it to the pool.

An :class:`Outcome` is a value (plain data: the runner reduces a result to it before it crosses the process
boundary, e.g. :func:`rewards.types.to_plain`) or a failure of a kind. The pool's own kinds are
:data:`POOL_FAILURE_KINDS`; each kind of plugin adds those of its result checks
(:data:`rewards.types.FAILURE_KINDS`, :data:`mmrl.agent.outputs.TOOL_FAILURE_KINDS`).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass

POOL_FAILURE_KINDS: tuple[str, ...] = ("timeout", "error", "crashed", "memory")
"""A call that ran past its timeout, raised, lost its worker process, or whose worker passed max_memory_mb."""

Emit = Callable[[tuple], None]
"""How a runner reports: ``("start", index)`` before a call takes a sample, ``("done", index, Outcome)``
after it."""


@dataclass(frozen=True)
class Outcome:
    """What one call on one sample produced: a value (plain data) or a failure (``failure`` its kind,
    ``message`` what happened)."""

    value: object = None
    failure: str | None = None
    message: str = ""


def timed_out(timeout_s: float) -> Outcome:
    return Outcome(failure="timeout", message=f"did not return within {timeout_s:g} s")


def raised(exc: BaseException) -> Outcome:
    """The outcome of a call that raised ``exc``, its message naming where in the plugin it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return Outcome(failure="error", message=f"{type(exc).__name__}: {exc}{where}")
