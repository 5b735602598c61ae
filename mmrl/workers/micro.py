"""Micro-batches of a rank's rows: by a row count, or by a token budget (``max_tokens_per_micro``).

A token budget keeps each forward's work even when responses differ in length: short responses share a
micro-batch, long ones get fewer neighbours. Sharded (FSDP) forwards are collectives, so every rank must run
as many micro-batches as every other: the count is the largest any rank needs, and a rank that needs fewer
splits its heaviest micro-batches until it has as many.
"""

from __future__ import annotations

import torch

from mmrl.parallel.grads import AllReduce
from mmrl.protocol import Batch


def row_tokens(batch: Batch, start: int, stop: int, share_prompt: bool) -> int:
    """Tokens rows [start, stop) put through a forward: real response tokens, plus each prompt's tokens
    once per distinct prompt (``share_prompt``) or once per row."""
    prompts = batch["prompt"][start:stop]
    distinct = {id(p): len(p) for p in prompts}.values() if share_prompt else [len(p) for p in prompts]
    return int(batch["response_mask"][start:stop].sum()) + sum(distinct)


def greedy_ranges(batch: Batch, budget: int, share_prompt: bool) -> list[tuple[int, int]]:
    """Consecutive row ranges, each within ``budget`` tokens (a single row over it stands alone)."""
    ranges, start = [], 0
    for stop in range(1, len(batch) + 1):
        if stop - start > 1 and row_tokens(batch, start, stop, share_prompt) > budget:
            ranges.append((start, stop - 1))
            start = stop - 1
    if len(batch):
        ranges.append((start, len(batch)))
    return ranges


def global_max(count: int, slots: int, all_reduce: AllReduce) -> int:
    """The largest ``count`` over ranks, with only a sum all-reduce: a one-hot over 0..slots, summed."""
    onehot = torch.zeros(slots + 1, dtype=torch.float64)
    onehot[count] = 1.0
    present = all_reduce(onehot).nonzero()
    return int(present.max())


def split_to(ranges: list[tuple[int, int]], count: int, batch: Batch, share_prompt: bool) -> list[tuple[int, int]]:
    """Halve the heaviest splittable range until there are ``count`` ranges."""
    ranges = list(ranges)
    while len(ranges) < count:
        splittable = [r for r in ranges if r[1] - r[0] > 1]
        if not splittable:
            raise ValueError(f"cannot form {count} micro-batches from {len(batch)} rows")
        start, stop = max(splittable, key=lambda r: row_tokens(batch, *r, share_prompt))
        middle = (start + stop) // 2
        at = ranges.index((start, stop))
        ranges[at : at + 1] = [(start, middle), (middle, stop)]
    return ranges


def micro_batches(
    batch: Batch, rows: int, budget: int, share_prompt: bool, all_reduce: AllReduce | None
) -> list[Batch]:
    """``batch`` cut into micro-batches of ``rows`` rows, or by the token ``budget`` when it is > 0.

    With a budget, ``all_reduce`` (a sum over ranks; None on one rank) makes the count equal on all ranks.
    Every rank's batch must have the same number of rows (the dispatcher pads them so).
    """
    if budget <= 0:
        return [batch.slice(start, start + rows) for start in range(0, len(batch), rows)]
    ranges = greedy_ranges(batch, budget, share_prompt)
    if all_reduce is not None:
        ranges = split_to(ranges, global_max(len(ranges), len(batch), all_reduce), batch, share_prompt)
    return [batch.slice(start, stop) for start, stop in ranges]
