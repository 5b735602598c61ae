"""Running a turn's tool calls: in worker processes (the plugin pool, :mod:`mmrl.plugins.pool`) or inline.

``isolation="process"`` (the default) gives every call the guarantees reward functions have: a tool that raises,
hangs (the GIL held included), crashes, exhausts ``max_memory_mb`` or returns something wrong costs that
call one :class:`~mmrl.agent.outputs.ToolOutput` failure, never the run. ``"inline"`` calls tools in this
thread: it protects from exceptions and bad results only (for trusted tools and tests).

A tool that hangs costs about one timeout per step, not one per call: within a turn the pool stops trying a
function whose first calls (one per worker) all timed out; across the turns of a step, once a tool has timed
out ``num_workers`` times and never returned, its later calls fail at once until :meth:`begin_step`.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Literal

from mmrl.agent.outputs import ToolOutput, check_outcome
from mmrl.agent.registry import resolve
from mmrl.agent.schemas import check_schema
from mmrl.agent.worker import ToolInput, execute
from mmrl.plugins.outcome import Outcome, raised
from mmrl.plugins.pool import PluginPool

Isolation = Literal["process", "inline"]
PendingCall = tuple[str, str, ToolInput]  # (the tool's name, its spec, the call)
_RETURNED = (None, "error", "bad_type", "too_large", "bad_image")  # failures of a call that came back


class ToolExecutor:
    """Runs tool calls by spec; one per run (its worker processes outlive steps)."""

    def __init__(self, *, isolation: Isolation = "process", num_workers: int = 2, timeout_s: float = 10.0,
                 max_memory_mb: float = 2048.0) -> None:
        if isolation not in ("process", "inline"):
            raise ValueError(f"tool isolation {isolation!r} is unknown; use 'process' or 'inline'")
        if num_workers < 1 or timeout_s <= 0 or max_memory_mb <= 0:
            raise ValueError(f"tool executor: num_workers={num_workers} must be >= 1, timeout_s={timeout_s} and "
                             f"max_memory_mb={max_memory_mb} > 0")
        self.isolation, self.num_workers, self.timeout_s = isolation, num_workers, timeout_s
        process = isolation == "process"
        self._pool = PluginPool(num_workers, max_memory_mb, runner="mmrl.agent.worker") if process else None
        self._inline: dict[str, Callable[..., Any] | Outcome] = {}  # spec -> function, or why it did not load
        self._timeouts: Counter[str] = Counter()  # this step's timed-out calls, by spec
        self._returned: Counter[str] = Counter()  # this step's calls that came back, by spec

    def start(self) -> float:
        """Start the worker processes now (else on first use); the seconds it took."""
        return self._pool.start() if self._pool is not None else 0.0

    def begin_step(self) -> None:
        """Forget which tools hung: each step tries every tool again."""
        self._timeouts.clear()
        self._returned.clear()

    def hung(self, spec: str) -> bool:
        """Whether ``spec``'s calls fail at once for the rest of the step."""
        return self._timeouts[spec] >= self.num_workers and not self._returned[spec]

    def describe(self, specs: Sequence[str]) -> list[dict[str, Any]]:
        """Each spec's checked schema, read where its code runs; ValueError for a tool that cannot be loaded."""
        outcomes = self._outcomes([(spec, [(0, ToolInput(describe=True))]) for spec in specs])
        schemas = []
        for spec, by_index in zip(specs, outcomes):
            outcome = by_index[0]
            if outcome.failure is not None or not isinstance(outcome.value, str):
                raise ValueError(f"tool {spec!r} could not be loaded: {outcome.message or 'no schema came back'}")
            schemas.append(check_schema(json.loads(outcome.value), spec))
        return schemas

    def run(self, calls: Sequence[PendingCall]) -> list[ToolOutput]:
        """Every call's output, in order; a failure is that call's :class:`ToolOutput`, never an exception."""
        outputs: list[ToolOutput | None] = [None] * len(calls)
        by_spec: dict[str, list[tuple[int, ToolInput]]] = defaultdict(list)
        for i, (name, spec, inp) in enumerate(calls):
            if self.hung(spec):
                outputs[i] = ToolOutput.failed("timeout", f"tool {name} failed: it did not finish in time earlier "
                                                          "in this step, so it was not run")
            else:
                by_spec[spec].append((i, inp))
        jobs = list(by_spec.items())
        for (spec, items), by_index in zip(jobs, self._outcomes(jobs)):
            for i, _ in items:
                outcome = by_index[i]
                self._timeouts[spec] += outcome.failure == "timeout"
                self._returned[spec] += outcome.failure in _RETURNED
                outputs[i] = check_outcome(outcome, calls[i][2].limits, calls[i][0])
        assert all(o is not None for o in outputs)
        return outputs  # type: ignore[return-value]

    def close(self) -> None:
        """End the worker processes (idempotent)."""
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> ToolExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _outcomes(self, jobs: Sequence[tuple[str, Sequence[tuple[int, ToolInput]]]]) -> list[dict[int, Outcome]]:
        if self._pool is not None:
            return self._pool.run(jobs, self.timeout_s)
        return [self._run_inline(spec, items) for spec, items in jobs]

    def _run_inline(self, spec: str, items: Sequence[tuple[int, ToolInput]]) -> dict[int, Outcome]:
        if spec not in self._inline:
            try:
                self._inline[spec] = resolve(spec)
            except Exception as exc:
                self._inline[spec] = raised(exc)
        fn = self._inline[spec]
        if isinstance(fn, Outcome):
            return {i: fn for i, _ in items}
        done: dict[int, Outcome] = {}
        execute(fn, items, self.timeout_s,
                lambda event: done.update({event[1]: event[2]}) if event[0] == "done" else None)
        return done
