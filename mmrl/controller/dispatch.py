"""Dispatch modes: how a WorkerGroup call is split across ranks and how the results are collected.

================  =====================================================  ==============================
mode              split                                                  collect
================  =====================================================  ==============================
ONE_TO_ALL        every rank gets the same arguments                     list of results, rank order
RANK_ZERO         every rank gets the same arguments (all take part in   rank 0's result
                  collectives)
DP_COMPUTE        the first argument, a Batch, is partitioned over the   Batches: rows put back in the
                  ranks by GROUP (the samples of one ``uid`` go to one   original sample order, padding
                  rank, the rank that already holds the group when the   dropped (k rows per input row
                  caller passes a placement; new groups are balanced by  are kept together as a block);
                  their tokens, :func:`group_partition`), then every     otherwise the list of results
                  rank is padded to the same row count with zero-weight  in rank order
                  copies of its own rows (marked by ``is_pad``). A
                  Batch without ``uid`` is partitioned sample by sample
                  (:func:`balanced_partition`). The other arguments go
                  to every rank
================  =====================================================  ==============================

:func:`split_args` returns the per-rank arguments and a :class:`DispatchPlan` (None outside DP_COMPUTE)
that :func:`collect` needs to undo the layout, and that tells the caller which rank took each group.

A worker method opts in with ``@register(Dispatch.X)``; the WorkerGroup binds every such method. A
DP_COMPUTE method names the Batch fields it reads, ``@register(Dispatch.DP_COMPUTE, fields=(...),
optional=(...))``: only those travel to the workers (the PNG bytes, texts and ground truths of a step stay
with the driver), and a missing required field fails in the driver with :meth:`Batch.require`'s message.
A method that reads the samples' prompt encodings says ``prompts=True``: the WorkerGroup then sends the
batch's ``prompt`` objects when the caller holds them, and otherwise the prompt's media (``messages``,
``images``, ``videos``) only to a rank that does not hold that prompt's encoding yet
(:mod:`mmrl.workers.prompts`): a prompt's media crosses to a group once per step. Samples with their own
scoring context (an agent episode's) also send its ``context_key``, and, when the driver holds the context
itself (``context``: the generating rank was another group's, or another group scores it too), the context to
a rank that does not hold that key yet: like a prompt's media, a context crosses to a group once per step, and
the prompt's media do not go with it (the context holds the prompt's pixels; an episode's n contexts share them).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from mmrl.models.media import MEDIA_KEYS  # the prompt's media as the driver holds it
from mmrl.protocol import Batch, sample_tokens

F = TypeVar("F", bound=Callable[..., Any])
DISPATCH_ATTR = "_mmrl_dispatch"
PAD_KEY = "is_pad"
# Per-token tensors zeroed on padding rows, so that those rows add nothing to token losses.
ZEROED_ON_PADDING = ("response_mask", "policy_mask", "advantages")
# A sample's own scoring context on the rank that generated it (an agent episode's; see mmrl.workers.prompts).
CONTEXT_KEY = "context_key"
# The scoring context itself (an EncodedPrompt), for a rank that does not hold its key yet.
CONTEXT = "context"


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
    prompts: bool = False
    """The method reads each sample's prompt encoding: ``prompt`` when the caller holds the encodings, else
    ``uid`` plus the media of the prompts the rank does not hold yet (see the module docstring)."""
    keep_prompts: bool = True
    """With ``prompts``: the ranks keep the encodings for the step's later calls (False: evaluation)."""

    def ship(self, batch: Batch) -> Batch:
        """The part of ``batch`` this method reads (all of it when no fields are declared)."""
        if not self.fields:
            return batch
        optional = self.optional
        if self.prompts:
            held = ("prompt",) if "prompt" in batch.objects else MEDIA_KEYS
            optional = (*optional, "uid", CONTEXT_KEY, *held, CONTEXT)
        return batch.select_fields(*self.fields, optional=optional)


def register(
    mode: Dispatch, *, fields: tuple[str, ...] = (), optional: tuple[str, ...] = (), prompts: bool = False,
    keep_prompts: bool = True,
) -> Callable[[F], F]:
    """Mark a worker method as callable on a whole WorkerGroup with ``mode`` (see the module table)."""
    if (fields or optional or prompts) and mode is not Dispatch.DP_COMPUTE:
        raise ValueError(f"fields are declared for DP_COMPUTE methods only, not {mode}")
    spec = DispatchSpec(mode, tuple(fields), tuple(optional), prompts, keep_prompts)

    def mark(fn: F) -> F:
        setattr(fn, DISPATCH_ATTR, spec)
        return fn

    return mark


@dataclass(frozen=True)
class DispatchPlan:
    """Where each rank's rows came from: ``sources[r][j]`` is the original index of row j of rank r,
    or -1 for a padding row. ``num_samples`` is the size of the original batch; ``ranks`` maps each group
    (``uid``) to the rank that took it (empty for a Batch without uids)."""

    sources: tuple[tuple[int, ...], ...]
    num_samples: int
    ranks: dict[str, int] = field(default_factory=dict)


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


def group_partition(
    uids: Sequence[str], weights: Sequence[int], num_parts: int, placement: Mapping[str, int] | None = None
) -> tuple[list[list[int]], dict[str, int]]:
    """Rows -> ``num_parts`` lists of row indices, every group (rows sharing a uid) whole in one part.

    A group named in ``placement`` goes to its rank. The others, heaviest first (a group weighs the sum of
    its rows' ``weights``), go to the lightest part whose row count stays within ``max(ceil(rows /
    num_parts), largest group)`` (ties to the lower index), or to the part with the fewest rows when none
    has room. Within a part, rows keep their original order. Returns the parts and uid -> part.
    """
    if num_parts <= 0:
        raise ValueError(f"num_parts must be positive, got {num_parts}")
    members: dict[str, list[int]] = {}
    for row, uid in enumerate(uids):
        members.setdefault(uid, []).append(row)
    placement = placement or {}
    ranks: dict[str, int] = {}
    sizes, loads = [0] * num_parts, [0] * num_parts
    for uid, rows in members.items():
        if uid in placement:
            rank = placement[uid]
            if not 0 <= rank < num_parts:
                raise ValueError(f"group {uid!r} is placed on rank {rank}, outside 0..{num_parts - 1}")
            ranks[uid] = rank
            sizes[rank] += len(rows)
            loads[rank] += sum(weights[r] for r in rows)
    cap = max(-(-len(uids) // num_parts), max(map(len, members.values()), default=0))
    fresh = sorted((u for u in members if u not in ranks),
                   key=lambda u: (-sum(weights[r] for r in members[u]), members[u][0]))
    for uid in fresh:
        size = len(members[uid])
        roomy = [p for p in range(num_parts) if sizes[p] + size <= cap]
        rank = min(roomy, key=lambda p: (loads[p], p)) if roomy else min(range(num_parts), key=lambda p: (sizes[p], p))
        ranks[uid] = rank
        sizes[rank] += size
        loads[rank] += sum(weights[r] for r in members[uid])
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    for row, uid in enumerate(uids):
        parts[ranks[uid]].append(row)
    return parts, ranks


def pad_rows(batch: Batch, rows: list[int], size: int, fallback: int = 0) -> tuple[Batch, list[int]]:
    """The rows ``rows`` of ``batch`` plus copies of its last one (of row ``fallback`` when ``rows`` is empty)
    up to ``size`` rows; copies have :data:`ZEROED_ON_PADDING` zeroed. Adds ``is_pad``; returns the Batch and
    the sources (-1 on copies)."""
    num_pad = size - len(rows)
    fill = rows[-1] if rows else fallback
    part = batch.select([*rows, *[fill] * num_pad])
    tensors = dict(part.tensors)
    for key in ZEROED_ON_PADDING:
        if key in tensors and num_pad:
            tensors[key][len(rows):] = 0  # part's tensors are fresh copies (select), the caller's are untouched
    tensors[PAD_KEY] = torch.arange(size) >= len(rows)
    return Batch(tensors=tensors, objects=part.objects, meta=part.meta), [*rows, *[-1] * num_pad]


def plan_dp(
    batch: Batch, world_size: int, placement: Mapping[str, int] | None = None, by_group: bool = True
) -> tuple[list[Batch], DispatchPlan]:
    """Each rank's Batch and the plan: by group when ``batch`` has ``uid`` and ``by_group`` (:func:`group_partition`,
    ``placement`` fixing groups a rank already holds), else sample by sample (:func:`balanced_partition`)."""
    if len(batch) == 0:
        raise ValueError("DP_COMPUTE got an empty batch; there is nothing to split over the workers")
    if PAD_KEY in batch.keys():
        raise ValueError(f"the batch already has {PAD_KEY!r}; DP_COMPUTE dispatch sets it, drop it first")
    if "uid" not in batch.objects or not by_group:
        padded = pad_to_multiple(batch, world_size)
        parts = balanced_partition(sample_tokens(padded), world_size)
        real = len(batch)
        sources = tuple(tuple(i if i < real else -1 for i in part) for part in parts)
        return [padded.select(part) for part in parts], DispatchPlan(sources=sources, num_samples=real)
    parts, ranks = group_partition(batch["uid"], sample_tokens(batch), world_size, placement)
    size = max(len(p) for p in parts)
    padded = [pad_rows(batch, part, size) for part in parts]
    sources = tuple(tuple(rows) for _, rows in padded)
    return [part for part, _ in padded], DispatchPlan(sources=sources, num_samples=len(batch), ranks=ranks)


def without_media(part: Batch, held: set[str]) -> Batch:
    """``part`` with the media of the prompts in ``held`` (uids a rank already encoded) and of the samples with
    their own scoring context (a ``context_key``: the context holds the prompt's pixels) replaced by None, and
    the scoring contexts whose keys are in ``held``."""
    objects = dict(part.objects)
    own = part.objects.get(CONTEXT_KEY) or [None] * len(part)
    for key in MEDIA_KEYS:
        if key in objects:
            objects[key] = [None if uid in held or context is not None else value
                            for uid, context, value in zip(part["uid"], own, objects[key])]
    if CONTEXT in objects:
        objects[CONTEXT] = [None if key in held else value for key, value in zip(part[CONTEXT_KEY], objects[CONTEXT])]
    return Batch(tensors=part.tensors, objects=objects, meta=part.meta)


# ---- split / collect ---------------------------------------------------------------------------


def split_args(
    spec: DispatchSpec, world_size: int, args: tuple, kwargs: dict,
    placement: Mapping[str, int] | None = None, held: Sequence[set[str]] | None = None, by_group: bool = True,
) -> tuple[list[tuple[tuple, dict]], DispatchPlan | None]:
    """Per-rank (args, kwargs) for a call, and the plan :func:`collect` needs (None but for DP_COMPUTE).

    ``placement`` (uid -> rank) keeps groups on the rank that holds them; ``held[r]``
    is the set of uids whose encodings rank r holds: their media are not sent again. ``by_group=False``
    scatters the samples of a group by tokens (the layout before groups stayed together; a bench baseline).
    """
    mode = spec.mode
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
        return [(args, kwargs)] * world_size, None
    if mode is Dispatch.DP_COMPUTE:
        if not args or not isinstance(args[0], Batch):
            raise TypeError("a DP_COMPUTE method takes a Batch as its first argument")
        batch = spec.ship(args[0])
        per_rank, plan = plan_dp(batch, world_size, placement, by_group)
        if held is not None and "uid" in batch.objects and "prompt" not in batch.objects:
            per_rank = [without_media(part, held[rank]) for rank, part in enumerate(per_rank)]
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
