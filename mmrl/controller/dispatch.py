"""Dispatch modes: how a WorkerGroup call is split across ranks and how the results are collected.

================  =====================================================  ==============================
mode              split                                                  collect
================  =====================================================  ==============================
ONE_TO_ALL        every rank gets the same arguments                     list of results, rank order
RANK_ZERO         every rank gets the same arguments (all take part in   rank 0's result
                  collectives)
DP_COMPUTE        the first argument, a Batch, is cut into world-size    ``Batch.concat`` in rank order
                  consecutive chunks (sizes differ by at most one); the  (or the list of results when
                  other arguments go to every rank                       they are not Batches)
================  =====================================================  ==============================

A worker method opts in with ``@register(Dispatch.X)``; the WorkerGroup binds every such method.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from mmrl.protocol import Batch

F = TypeVar("F", bound=Callable[..., Any])
DISPATCH_ATTR = "_mmrl_dispatch"


class Dispatch(enum.Enum):
    ONE_TO_ALL = "one_to_all"
    RANK_ZERO = "rank_zero"
    DP_COMPUTE = "dp_compute"


def register(mode: Dispatch) -> Callable[[F], F]:
    """Mark a worker method as callable on a whole WorkerGroup with ``mode``."""

    def mark(fn: F) -> F:
        setattr(fn, DISPATCH_ATTR, mode)
        return fn

    return mark


def split_args(mode: Dispatch, world_size: int, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
    """Per-rank (args, kwargs) for a call."""
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
        return [(args, kwargs)] * world_size
    if mode is Dispatch.DP_COMPUTE:
        if not args or not isinstance(args[0], Batch):
            raise TypeError("a DP_COMPUTE method takes a Batch as its first argument")
        batch = args[0]
        if len(batch) < world_size:
            raise ValueError(
                f"a batch of {len(batch)} samples cannot be split over {world_size} workers; "
                "use more prompts per step or fewer workers"
            )
        return [((chunk, *args[1:]), kwargs) for chunk in batch.chunk(world_size)]
    raise ValueError(f"unknown dispatch mode {mode}")


def collect(mode: Dispatch, results: Sequence[Any]) -> Any:
    if mode is Dispatch.ONE_TO_ALL:
        return list(results)
    if mode is Dispatch.RANK_ZERO:
        return results[0]
    if mode is Dispatch.DP_COMPUTE:
        if all(isinstance(r, Batch) for r in results):
            return Batch.concat(results)
        return list(results)
    raise ValueError(f"unknown dispatch mode {mode}")
