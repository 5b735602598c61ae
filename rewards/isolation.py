"""Calling a user's function on many items in threads, each call within a timeout.

A hung Python call cannot be killed. In a ThreadPoolExecutor it would keep its
worker busy, so the samples queued behind it would wait and time out in turn,
and it would block interpreter exit. Here each batch gets its own daemon
worker threads; a call past its deadline is given up on, its worker is
abandoned (it exits once the call returns) and a fresh worker takes its place.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

_MAX_POLL_S = 0.05  # how late past its deadline a hung call may be noticed, at most


@dataclass(frozen=True)
class Outcome:
    """What one call produced: a value, the exception it raised, or a timeout."""

    value: object = None
    error: BaseException | None = None
    timed_out: bool = False


def run_isolated(
    call: Callable[[T], object], items: Sequence[T], timeout_s: float, max_workers: int
) -> list[Outcome]:
    """``call(item)`` for every item, at most ``max_workers`` at once, in item order.

    Each call's timeout counts from when that call starts. Whatever a call
    raises becomes its Outcome.error; it never propagates.
    """
    batch = _Batch(call, items, timeout_s)
    for _ in range(min(max_workers, len(items))):
        batch.add_worker()
    poll_s = min(_MAX_POLL_S, timeout_s / 4)
    while not batch.all_done.wait(poll_s):
        batch.expire_overdue()
    return batch.outcomes()


class _Batch(Generic[T]):
    """Shared state of one run_isolated call; every field is guarded by the lock."""

    def __init__(self, call: Callable[[T], object], items: Sequence[T], timeout_s: float) -> None:
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

    def add_worker(self) -> None:
        threading.Thread(target=self._work, name="mmrl-reward-worker", daemon=True).start()

    def outcomes(self) -> list[Outcome]:
        with self._lock:
            assert all(o is not None for o in self._outcomes), "outcomes() called before all_done"
            return list(self._outcomes)  # type: ignore[arg-type]

    def expire_overdue(self) -> None:
        """Give up on calls past their deadline and replace their workers."""
        now = time.monotonic()
        with self._lock:
            overdue = [i for i, deadline in self._deadlines.items() if now >= deadline]
            for index in overdue:
                del self._deadlines[index]
                self._resolve(index, Outcome(timed_out=True))
            workers_needed = min(len(overdue), len(self._items) - self._next)
        for _ in range(workers_needed):
            self.add_worker()

    def _work(self) -> None:
        while (index := self._claim()) is not None:
            try:
                outcome = Outcome(value=self._call(self._items[index]))
            except BaseException as exc:  # isolate the user's function: any failure is this item's error
                outcome = Outcome(error=exc)
            if not self._finish(index, outcome):
                return  # this call timed out and a new worker has taken this one's place

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
