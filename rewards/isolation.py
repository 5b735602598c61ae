"""Calling a reward function on samples, and what each call did.

:func:`execute` calls one function on a chunk of samples and reports, for each sample, when its call
started and its :class:`Outcome`. Worker processes (:mod:`rewards.pool`) run it and stream the reports
to the parent, which enforces the deadlines by killing the process.

:func:`run_inline` runs it in the driver instead (``isolation="inline"``), in daemon threads with
timeouts. Inline gives no protection: a function that holds the GIL stalls the driver past its
timeout and its late result is kept, ``os._exit`` or a segfault ends the run, and its memory is the
driver's. Use it for trusted, well-behaved code only.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rewards.types import (
    CallPlan,
    RewardFn,
    RewardInput,
    bind,
    describe_fn,
    is_result_list,
    plan_call,
    to_plain,
    type_name,
)

FAILURE_KINDS: tuple[str, ...] = (
    "timeout", "error", "crashed", "memory", "bad_type", "non_finite", "out_of_range",
)
GRACE_S = 0.25  # past timeout_s before a call is abandoned: an async function's own timeout reports first

Item = tuple[int, RewardInput]  # (the sample's index in the score() call, the sample)
# Receives ("start", index) before a call takes the sample, and ("done", index, Outcome) after.
Emit = Callable[[tuple], None]
T = TypeVar("T")

_MAX_POLL_S = 0.05  # how late past its deadline a hung inline call may be noticed, at most


@dataclass(frozen=True)
class Outcome:
    """What one call on one sample produced: a value (plain data, see ``to_plain``) or a failure."""

    value: object = None
    failure: str | None = None  # one of FAILURE_KINDS
    message: str = ""


def timed_out(timeout_s: float) -> Outcome:
    return Outcome(failure="timeout", message=f"did not return within {timeout_s:g} s")


def execute(fn: RewardFn, items: Sequence[Item], timeout_s: float, emit: Emit) -> None:
    """Call ``fn`` on every sample of ``items``, reporting each through ``emit``; never raises.

    A plain function takes the samples one by one, a batched one in a single call, an async one
    concurrently on one event loop. A call taking longer than ``timeout_s`` is a timeout even if it
    returns (an async call is cancelled); one that never returns is the caller's to stop.
    """
    owner = describe_fn(fn)
    try:
        plan = plan_call(fn)
    except TypeError as exc:
        for index, _ in items:
            emit(("done", index, raised(exc)))
        return
    if plan.batched:
        _execute_batched(fn, plan, owner, items, timeout_s, emit)
    elif plan.is_async:
        asyncio.run(_execute_async(fn, plan, owner, items, timeout_s, emit))
    else:
        _execute_plain(fn, plan, owner, items, timeout_s, emit)


def _execute_plain(fn: RewardFn, plan: CallPlan, owner: str, items: Sequence[Item], timeout_s: float,
                   emit: Emit) -> None:
    for index, inp in items:
        emit(("start", index))
        start = time.monotonic()
        try:
            result = fn(**bind(plan, inp, owner))
            if inspect.isawaitable(result):  # e.g. a sync wrapper returning a coroutine
                result = asyncio.run(_within(result, timeout_s))
            outcome = _returned(result, start, timeout_s)
        except BaseException as exc:  # the plugin's failure is this sample's, whatever it is
            outcome = raised(exc)
        emit(("done", index, outcome))


def _execute_batched(fn: RewardFn, plan: CallPlan, owner: str, items: Sequence[Item], timeout_s: float,
                     emit: Emit) -> None:
    indices, calls = [], []
    for index, inp in items:
        emit(("start", index))
        try:
            calls.append(bind(plan, inp, owner))
            indices.append(index)
        except TypeError as exc:
            emit(("done", index, raised(exc)))
    if not indices:
        return
    start = time.monotonic()
    try:
        results = fn(**{name: [kwargs[name] for kwargs in calls] for name in calls[0]})
        if inspect.isawaitable(results):
            results = asyncio.run(_within(results, timeout_s))
        outcomes = _split_batch(results, len(indices), start, timeout_s)
    except BaseException as exc:
        outcomes = [raised(exc)] * len(indices)
    for index, outcome in zip(indices, outcomes):
        emit(("done", index, outcome))


def _split_batch(results: Any, count: int, start: float, timeout_s: float) -> list[Outcome]:
    """One outcome per sample from a batched call's return value."""
    if results is _TIMED_OUT or time.monotonic() - start > timeout_s:
        return [timed_out(timeout_s)] * count
    if not is_result_list(results) or len(results) != count:
        got = f"{len(results)} results" if is_result_list(results) else f"a {type_name(results)}"
        message = (f"batched reward function returned {got} for {count} samples; "
                   "return a list with one result per sample")
        return [Outcome(failure="bad_type", message=message)] * count
    return [Outcome(value=to_plain(result)) for result in results]


async def _execute_async(fn: RewardFn, plan: CallPlan, owner: str, items: Sequence[Item], timeout_s: float,
                         emit: Emit) -> None:
    async def one(index: int, inp: RewardInput) -> None:
        emit(("start", index))
        start = time.monotonic()
        try:
            outcome = _returned(await _within(fn(**bind(plan, inp, owner)), timeout_s), start, timeout_s)
        except BaseException as exc:
            outcome = raised(exc)
        emit(("done", index, outcome))

    await asyncio.gather(*(one(index, inp) for index, inp in items))


_TIMED_OUT = object()


async def _within(awaitable: Any, timeout_s: float) -> Any:
    """The awaitable's result, or _TIMED_OUT (after cancelling it) past ``timeout_s``.

    Unlike asyncio.wait_for, a TimeoutError the plugin raises itself stays an error.
    """
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        task.cancel()
        return _TIMED_OUT
    return task.result()


def _returned(result: object, start: float, timeout_s: float) -> Outcome:
    if result is _TIMED_OUT or time.monotonic() - start > timeout_s:
        return timed_out(timeout_s)
    return Outcome(value=to_plain(result))


def raised(exc: BaseException) -> Outcome:
    """The outcome of a call that raised ``exc``, its message naming where in the plugin it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    where = f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})" if last else ""
    return Outcome(failure="error", message=f"{type(exc).__name__}: {exc}{where}")


# --- inline: in the driver's threads ----------------------------------------------------------------


def run_inline(fn: RewardFn, items: Sequence[Item], timeout_s: float, num_threads: int) -> dict[int, Outcome]:
    """:func:`execute` in this process: a plain function on ``num_threads`` threads, one sample per call;
    a batched or async one in a single thread. A call past its deadline is abandoned, not stopped."""
    try:
        plan = plan_call(fn)
    except TypeError as exc:
        return {index: raised(exc) for index, _ in items}
    if plan.batched or plan.is_async:
        return _inline_chunk(fn, items, timeout_s)
    outcomes = run_threads(lambda item: _inline_one(fn, item, timeout_s), items, timeout_s, num_threads)
    return {index: outcome for (index, _), outcome in zip(items, outcomes)}


def _inline_one(fn: RewardFn, item: Item, timeout_s: float) -> Outcome:
    done: dict[int, Outcome] = {}
    execute(fn, [item], timeout_s, lambda event: _collect(done, event))
    return done[item[0]]


def _inline_chunk(fn: RewardFn, items: Sequence[Item], timeout_s: float) -> dict[int, Outcome]:
    done: dict[int, Outcome] = {}

    def run_all(_: None) -> Outcome:
        execute(fn, items, timeout_s, lambda event: _collect(done, event))
        return Outcome()

    [whole] = run_threads(run_all, [None], timeout_s + GRACE_S, 1)
    finished = dict(done)  # an abandoned call may still add to it
    fallback = whole if whole.failure else timed_out(timeout_s)
    return {index: finished.get(index, fallback) for index, _ in items}


def _collect(done: dict[int, Outcome], event: tuple) -> None:
    if event[0] == "done":
        done[event[1]] = event[2]


def run_threads(call: Callable[[T], Outcome], items: Sequence[T], timeout_s: float,
                max_workers: int) -> list[Outcome]:
    """``call(item)`` for every item, at most ``max_workers`` at once, in item order.

    Each call's timeout counts from when that call starts. A hung Python call cannot be killed: in a
    ThreadPoolExecutor it would keep its worker busy, so the items behind it would wait and time out
    in turn. Here each run has its own daemon threads; a call past its deadline is given up on, its
    thread abandoned (it exits once the call returns) and a fresh thread takes its place. Whatever a
    call raises becomes its outcome's error.
    """
    run = _ThreadRun(call, items, timeout_s)
    for _ in range(min(max_workers, len(items))):
        run.add_thread()
    poll_s = min(_MAX_POLL_S, timeout_s / 4)
    while not run.all_done.wait(poll_s):
        run.expire_overdue()
    return run.outcomes()


class _ThreadRun(Generic[T]):
    """Shared state of one run_threads call; every field is guarded by the lock."""

    def __init__(self, call: Callable[[T], Outcome], items: Sequence[T], timeout_s: float) -> None:
        self._call = call
        self._items = items
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._next = 0
        self._deadlines: dict[int, float] = {}  # running item index -> monotonic deadline
        self._outcomes: list[Outcome | None] = [None] * len(items)
        self._remaining = len(items)
        self.all_done = threading.Event()
        if not items:
            self.all_done.set()

    def add_thread(self) -> None:
        threading.Thread(target=self._work, name="mmrl-reward-inline", daemon=True).start()

    def outcomes(self) -> list[Outcome]:
        with self._lock:
            assert all(o is not None for o in self._outcomes), "outcomes() called before all_done"
            return list(self._outcomes)  # type: ignore[arg-type]

    def expire_overdue(self) -> None:
        """Give up on calls past their deadline and replace their threads."""
        now = time.monotonic()
        with self._lock:
            overdue = [i for i, deadline in self._deadlines.items() if now >= deadline]
            for index in overdue:
                del self._deadlines[index]
                self._resolve(index, timed_out(self._timeout_s))
            threads_needed = min(len(overdue), len(self._items) - self._next)
        for _ in range(threads_needed):
            self.add_thread()

    def _work(self) -> None:
        while (index := self._claim()) is not None:
            try:
                outcome = self._call(self._items[index])
            except BaseException as exc:  # isolate the user's function: any failure is this item's error
                outcome = raised(exc)
            if not self._finish(index, outcome):
                return  # this call timed out and a new thread has taken this one's place

    def _claim(self) -> int | None:
        with self._lock:
            if self._next >= len(self._items):
                return None
            index = self._next
            self._next += 1
            self._deadlines[index] = time.monotonic() + self._timeout_s
            return index

    def _finish(self, index: int, outcome: Outcome) -> bool:
        with self._lock:
            if index not in self._deadlines:
                return False
            del self._deadlines[index]
            self._resolve(index, outcome)
            return True

    def _resolve(self, index: int, outcome: Outcome) -> None:
        self._outcomes[index] = outcome
        self._remaining -= 1
        if self._remaining == 0:
            self.all_done.set()
