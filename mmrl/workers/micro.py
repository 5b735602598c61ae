"""Mini- and micro-batches of a rank's rows: by a row count, or by a token budget (``max_tokens_per_micro``).

Both are cut between prompts: the samples of one prompt stay in one micro-batch (and one mini-batch), so its
media go through the vision tower once per pass (unless its samples alone exceed the budget). A token budget
keeps each forward's work even when responses differ in length: short responses share a micro-batch, long
ones get fewer neighbours. Sharded (FSDP) forwards are collectives, so every rank must run as many
micro-batches as every other: the count is the largest any rank needs, and a rank that needs fewer splits its
heaviest micro-batches until it has as many.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mmrl.parallel.grads import AllReduce
from mmrl.protocol import Batch, balanced_sizes

Cost = Callable[[int, int], int]


def prompt_runs(batch: Batch) -> list[tuple[int, int]]:
    """Consecutive row ranges [start, stop) that share one prompt: the same ``prompt`` object, else the same
    ``uid``; each row alone when the batch has neither."""
    keys = ([id(p) for p in batch["prompt"]] if "prompt" in batch.objects else
            batch["uid"] if "uid" in batch.objects else list(range(len(batch))))
    runs, start = [], 0
    for row in range(1, len(keys) + 1):
        if row == len(keys) or keys[row] != keys[start]:
            runs.append((start, row))
            start = row
    return runs


def row_tokens(batch: Batch, start: int, stop: int, share_prompt: bool) -> int:
    """Tokens rows [start, stop) put through a forward: real response tokens, plus each prompt's tokens
    once per distinct prompt (``share_prompt``) or once per row."""
    prompts = batch["prompt"][start:stop]
    distinct = {id(p): len(p) for p in prompts}.values() if share_prompt else [len(p) for p in prompts]
    return int(batch["response_mask"][start:stop].sum()) + sum(distinct)


def greedy_ranges(batch: Batch, budget: int, share_prompt: bool, cost: Cost | None = None) -> list[tuple[int, int]]:
    """Consecutive row ranges, each within ``budget`` by ``cost`` (default: :func:`row_tokens`), cut between
    prompt runs; a run over the budget is cut between its rows (a single row over it stands alone)."""
    cost = cost or (lambda start, stop: row_tokens(batch, start, stop, share_prompt))
    ranges, start = [], 0
    for run_start, run_stop in prompt_runs(batch):
        if cost(start, run_stop) <= budget:
            continue  # the run joins the open range
        if start < run_start:
            ranges.append((start, run_start))
            start = run_start
        if cost(start, run_stop) <= budget:
            continue
        for stop in range(run_start + 1, run_stop + 1):
            if stop - start > 1 and cost(start, stop) > budget:
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
    """Split the heaviest range that holds several prompt runs, at the run boundary nearest its middle, until
    there are ``count`` ranges or every range is one run (a prompt is not cut in two to make up a count)."""
    ranges = list(ranges)
    bounds = {stop for _, stop in prompt_runs(batch)}
    while len(ranges) < count:
        splittable = [r for r in ranges if any(r[0] < b < r[1] for b in bounds)]
        if not splittable:
            break
        start, stop = max(splittable, key=lambda r: row_tokens(batch, *r, share_prompt))
        middle = min((b for b in bounds if start < b < stop), key=lambda b: (abs(2 * b - start - stop), b))
        at = ranges.index((start, stop))
        ranges[at : at + 1] = [(start, middle), (middle, stop)]
    return ranges


FILLER = "filler"  # meta key of a micro-batch that only keeps a rank in step with the others


def filler(batch: Batch) -> Batch:
    """A zero-weight micro-batch for a rank that has fewer micro-batches than another (sharded forwards are
    collectives): a copy of the last row with every mask and advantage zeroed, whose prompt is a one-token
    text stub (no media), marked ``meta[FILLER]``; its outputs are to be dropped."""
    from mmrl.controller.dispatch import ZEROED_ON_PADDING
    from mmrl.models.encoding import EncodedPrompt

    row = batch.slice(len(batch) - 1, len(batch))
    tensors = {k: torch.zeros_like(v) if k in ZEROED_ON_PADDING else v for k, v in row.tensors.items()}
    tensors["is_pad"] = torch.ones(1, dtype=torch.bool)
    objects = dict(row.objects)
    if "prompt" in objects:
        stub = torch.zeros(1, dtype=torch.long)
        objects["prompt"] = [EncodedPrompt(input_ids=stub, mm_token_type_ids=stub.clone(), name="filler")]
    return Batch(tensors=tensors, objects=objects, meta={**row.meta, FILLER: True})


def micro_batches(
    batch: Batch, rows: int, budget: int, share_prompt: bool, all_reduce: AllReduce | None, slots: int = 0
) -> list[Batch]:
    """``batch`` cut into micro-batches of at most ``rows`` real rows, or by the token ``budget`` when it is > 0,
    between prompts where it can (:func:`greedy_ranges`).

    ``all_reduce`` (a sum over ranks; None on one rank) makes the count equal on all ranks, by splitting ranges
    between prompts and then by zero-weight :func:`filler` micro-batches; ``slots`` bounds
    any rank's count and must be the same on all of them (default ``len(batch)``, right when every rank's
    batch has as many rows, as the dispatcher pads them).
    """
    if budget <= 0:
        # Padding rows (copies of a rank's last sample, zero-weight) ride along free: they share its prompt.
        real = (~batch["is_pad"]).long().cumsum(0).tolist() if "is_pad" in batch.tensors else None
        count = (lambda start, stop: stop - start) if real is None else (
            lambda start, stop: real[stop - 1] - (real[start - 1] if start else 0))
        ranges = greedy_ranges(batch, rows, share_prompt, cost=count)
    else:
        ranges = greedy_ranges(batch, budget, share_prompt)
    if all_reduce is not None:
        count = global_max(len(ranges), slots or len(batch), all_reduce)
        ranges = split_to(ranges, count, batch, share_prompt)
        return [batch.slice(start, stop) for start, stop in ranges] + [filler(batch)] * (count - len(ranges))
    return [batch.slice(start, stop) for start, stop in ranges]


def mini_batches(batch: Batch, count: int) -> list[Batch]:
    """``count`` consecutive pieces of ``batch`` of about equal row counts, cut between prompt runs (each cut at
    the run boundary nearest its share of the rows); by rows alone when there are fewer runs than pieces."""
    runs = prompt_runs(batch)
    if len(runs) < count:
        return batch.split(balanced_sizes(len(batch), count))
    bounds = [stop for _, stop in runs[:-1]]  # where a cut may go
    cuts, low = [], 0
    for k in range(1, count):
        high = len(bounds) - (count - 1 - k)  # leave a boundary for each cut still to come
        target = k * len(batch) / count
        at = min(range(low, high), key=lambda i: (abs(bounds[i] - target), i))
        cuts.append(bounds[at])
        low = at + 1
    edges = [0, *cuts, len(batch)]
    return [batch.slice(a, b) for a, b in zip(edges, edges[1:])]
