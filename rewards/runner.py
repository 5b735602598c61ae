"""The runner of reward functions in a :class:`~mmrl.plugins.pool.PluginPool`: how one is called on samples.

A worker process of the reward pool resolves a spec with :func:`resolve` (:mod:`rewards.registry`), learns
which bulky :class:`RewardInput` fields the function reads (:func:`fields_read`) and calls it with
:func:`execute`: a plain function one sample at a time, a batched one in a single call, an async one
concurrently on one event loop; each sample's :class:`~mmrl.plugins.outcome.Outcome` carries the result as
plain data (:func:`rewards.types.to_plain`) or its failure. :func:`run_inline` does the same in the caller's
thread (``isolation="inline"``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Sequence
from typing import Any

from mmrl.plugins.outcome import Emit, Outcome, raised, timed_out
from rewards.registry import resolve
from rewards.types import (
    PEER_KEYWORDS,
    CallPlan,
    RewardFn,
    RewardInput,
    bind,
    describe_fn,
    is_result_list,
    plan_call,
    to_plain,
)

BULKY_FIELDS = ("images", "videos", "extra")  # not sent to a function known not to take them
NOUN = "reward"  # what a spec names, in messages: "reward worker", "reward function"

Item = tuple[int, RewardInput]  # (the sample's index in the caller's batch, the sample)

__all__ = ["BULKY_FIELDS", "NOUN", "execute", "fields_read", "resolve", "run_inline"]


def run_inline(fn: RewardFn, items: Sequence[Item], timeout_s: float) -> dict[int, Outcome]:
    """:func:`execute` in this thread: protects from exceptions and bad values only. A call that returns
    late is a timeout, but nothing stops one that never returns, or a crash, or its memory."""
    done: dict[int, Outcome] = {}
    execute(fn, items, timeout_s, lambda event: done.update({event[1]: event[2]}) if event[0] == "done" else None)
    return done


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
        if results is _TIMED_OUT or time.monotonic() - start > timeout_s:
            outcomes = [timed_out(timeout_s)] * len(indices)
        elif not is_result_list(results) or len(results) != len(indices):
            got = f"{len(results)} results" if is_result_list(results) else f"a {type(results).__name__}"
            message = (f"batched reward function returned {got} for {len(indices)} samples; "
                       "return a list with one result per sample")
            outcomes = [Outcome(failure="bad_type", message=message)] * len(indices)
        else:
            outcomes = [Outcome(value=to_plain(result)) for result in results]
    except BaseException as exc:
        outcomes = [raised(exc)] * len(indices)
    for index, outcome in zip(indices, outcomes):
        emit(("done", index, outcome))


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


def fields_read(fn: RewardFn) -> tuple[str, ...]:
    """The RewardInput fields a call of ``fn`` reads: those it takes, and ``extra`` for its row columns."""
    try:
        plan = plan_call(fn)
    except TypeError:
        return BULKY_FIELDS  # it will fail on its own; send everything
    return tuple(PEER_KEYWORDS.get(name, name) for name in plan.fields) + (("extra",) if plan.columns else ())
