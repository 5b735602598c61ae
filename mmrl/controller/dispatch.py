"""Dispatch modes: how a WorkerGroup call is split across ranks and how the results are collected.

================  =====================================================  ==============================
mode              split                                                  collect
================  =====================================================  ==============================
ONE_TO_ALL        every rank gets the same arguments                     list of results, rank order
RANK_ZERO         every rank gets the same arguments (all take part in   rank 0's result
                  collectives)
DP_COMPUTE        the first argument, a Batch, is padded to a multiple   Batches: rows put back in the
                  of the world size with zero-weight copies (marked by   original sample order, padding
                  ``is_pad``), then partitioned into equal-size parts    dropped (k rows per input row
                  balanced by token count (:func:`balanced_partition`    are kept together as a block);
                  of :func:`mmrl.protocol.sample_tokens`); the other     otherwise the list of results
                  arguments go to every rank                             in rank order
================  =====================================================  ==============================

:func:`split_args` returns the per-rank arguments and a :class:`DispatchPlan` (None outside DP_COMPUTE)
that :func:`collect` needs to undo the layout.

A worker method opts in with ``@register(Dispatch.X)``; the WorkerGroup binds every such method. A
DP_COMPUTE method names the Batch fields it reads, ``@register(Dispatch.DP_COMPUTE, fields=(...),
optional=(...))``: only those travel to the workers (the PNG bytes, texts and ground truths of a step stay
with the driver), and a missing required field fails in the driver with :meth:`Batch.require`'s message.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from mmrl.protocol import Batch, sample_tokens

F = TypeVar("F", bound=Callable[..., Any])
DISPATCH_ATTR = "_mmrl_dispatch"
PAD_KEY = "is_pad"
# Per-token tensors zeroed on padding rows, so that those rows add nothing to token losses.
ZEROED_ON_PADDING = ("response_mask", "advantages")


class Dispatch(enum.Enum):
    ONE_TO_ALL = "one_to_all"
    RANK_ZERO = "rank_zero"
    DP_COMPUTE = "dp_compute"


@dataclass(frozen=True)
class DispatchSpec:
    """How a registered method is called on a group: its mode and, for DP_COMPUTE, the fields it reads."""

    mode: Dispatch
    fields: tuple[str, ...] = ()
    """Batch fields the method needs; only these (and ``optional``) are sent. Empty: the whole Batch."""
    optional: tuple[str, ...] = ()
    """Batch fields sent when present."""

    def ship(self, batch: Batch) -> Batch:
        """The part of ``batch`` this method reads (all of it when no fields are declared)."""
        if not self.fields:
            return batch
        return batch.select_fields(*self.fields, optional=self.optional)


def register(mode: Dispatch, *, fields: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Mark a worker method as callable on a whole WorkerGroup with ``mode`` (see the module table)."""
    if (fields or optional) and mode is not Dispatch.DP_COMPUTE:
        raise ValueError(f"fields are declared for DP_COMPUTE methods only, not {mode}")
    spec = DispatchSpec(mode, tuple(fields), tuple(optional))

    def mark(fn: F) -> F:
        setattr(fn, DISPATCH_ATTR, spec)
        return fn

    return mark


@dataclass(frozen=True)
class DispatchPlan:
    """Where each rank's rows came from: ``sources[r][j]`` is the original index of row j of rank r,
    or -1 for a padding row. ``num_samples`` is the size of the original batch."""

    sources: tuple[tuple[int, ...], ...]
    num_samples: int


# ---- layout ------------------------------------------------------------------------------------


def balanced_partition(weights: Sequence[int], num_parts: int) -> list[list[int]]:
    """``num_parts`` lists of indices into ``weights``, all of exactly ``len(weights) / num_parts`` items.

    Greedy (LPT with a size cap): heaviest item first, each to the lightest part that still has room
    (ties to the lower part index). Each part's indices are returned in ascending order.
    """
    if num_parts <= 0:
        raise ValueError(f"num_parts must be positive, got {num_parts}")
    if len(weights) % num_parts:
        raise ValueError(f"{len(weights)} items cannot be split into {num_parts} parts of equal size")
    size = len(weights) // num_parts
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    loads = [0] * num_parts
    for index in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        part = min((p for p in range(num_parts) if len(parts[p]) < size), key=lambda p: (loads[p], p))
        parts[part].append(index)
        loads[part] += weights[index]
    return [sorted(part) for part in parts]


def pad_to_multiple(batch: Batch, multiple: int) -> Batch:
    """``batch`` plus copies of its first samples (cycling) up to a multiple of ``multiple`` rows.

    Copies have :data:`ZEROED_ON_PADDING` tensors zeroed. Adds ``is_pad`` (B',) bool, True on copies.
    """
    if len(batch) == 0:
        raise ValueError("DP_COMPUTE got an empty batch; there is nothing to split over the workers")
    if PAD_KEY in batch.keys():
        raise ValueError(f"the batch already has {PAD_KEY!r}; DP_COMPUTE dispatch sets it, drop it first")
    real = len(batch)
    num_pad = -real % multiple
    padded = batch.select([*range(real), *(i % real for i in range(num_pad))]) if num_pad else batch
    tensors = dict(padded.tensors)
    for key in ZEROED_ON_PADDING:
        if key in tensors and num_pad:
            tensors[key][real:] = 0  # padded's tensors are fresh copies (select), the caller's are untouched
    tensors[PAD_KEY] = torch.arange(real + num_pad) >= real
    return Batch(tensors=tensors, objects=padded.objects, meta=padded.meta)


def plan_dp(batch: Batch, world_size: int) -> tuple[list[Batch], DispatchPlan]:
    """Pad ``batch``, partition it by token count, and return each rank's Batch with the plan."""
    padded = pad_to_multiple(batch, world_size)
    parts = balanced_partition(sample_tokens(padded), world_size)
    real = len(batch)
    sources = tuple(tuple(i if i < real else -1 for i in part) for part in parts)
    return [padded.select(part) for part in parts], DispatchPlan(sources=sources, num_samples=real)


# ---- split / collect ---------------------------------------------------------------------------


def split_args(
    spec: DispatchSpec, world_size: int, args: tuple, kwargs: dict, ship_all_fields: bool = False
) -> tuple[list[tuple[tuple, dict]], DispatchPlan | None]:
    """Per-rank (args, kwargs) for a call, and the plan :func:`collect` needs (None but for DP_COMPUTE).

    ``ship_all_fields`` sends the whole Batch even where the method declares its fields (a baseline
    for ``make bench``).
    """
    mode = spec.mode
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
        return [(args, kwargs)] * world_size, None
    if mode is Dispatch.DP_COMPUTE:
        if not args or not isinstance(args[0], Batch):
            raise TypeError("a DP_COMPUTE method takes a Batch as its first argument")
        batch = args[0] if ship_all_fields else spec.ship(args[0])
        per_rank, plan = plan_dp(batch, world_size)
        return [((part, *args[1:]), kwargs) for part in per_rank], plan
    raise ValueError(f"unknown dispatch mode {mode}")


def collect(mode: Dispatch, results: Sequence[Any], plan: DispatchPlan | None = None) -> Any:
    """The call's result from the per-rank ``results`` (see the module table)."""
    if mode is Dispatch.ONE_TO_ALL:
        return list(results)
    if mode is Dispatch.RANK_ZERO:
        return results[0]
    if mode is Dispatch.DP_COMPUTE:
        if all(isinstance(r, Batch) for r in results):
            if plan is None:
                raise ValueError("collecting DP_COMPUTE Batches needs the DispatchPlan split_args returned")
            return restore_order([without_pad(r) for r in results], plan)
        return list(results)
    raise ValueError(f"unknown dispatch mode {mode}")


def without_pad(batch: Batch) -> Batch:
    """``batch`` without its ``is_pad`` field (a worker may hand its input back)."""
    return Batch(
        tensors={k: v for k, v in batch.tensors.items() if k != PAD_KEY},
        objects={k: v for k, v in batch.objects.items() if k != PAD_KEY},
        meta=batch.meta,
    )


def restore_order(results: Sequence[Batch], plan: DispatchPlan) -> Batch:
    """Rank results -> one Batch in original sample order, padding rows dropped.

    Rank r's result must hold k_r rows per input row (k_r = 1 for most methods, n for ``generate``),
    the k_r rows of input row j at ``j*k_r .. j*k_r + k_r - 1``; each block moves as a whole.
    """
    if len(results) != len(plan.sources):
        raise ValueError(f"got {len(results)} results for {len(plan.sources)} ranks")
    rows: list[list[int]] = [[] for _ in range(plan.num_samples)]
    offset = 0
    for rank, (result, sources) in enumerate(zip(results, plan.sources)):
        if len(result) % len(sources):
            raise ValueError(
                f"rank {rank} returned {len(result)} rows for {len(sources)} input rows; a DP_COMPUTE "
                "method must return the same number of rows (k >= 0) for each input row"
            )
        per_row = len(result) // len(sources)
        for j, source in enumerate(sources):
            if source >= 0:
                start = offset + j * per_row
                rows[source] = list(range(start, start + per_row))
        offset += len(result)
    return Batch.concat(results).select([r for block in rows for r in block])
