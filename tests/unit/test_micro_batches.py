"""Micro-batches by rows or by a token budget (mmrl.workers.micro), checked by hand."""

from __future__ import annotations

import pytest
import torch

from mmrl.protocol import Batch
from mmrl.workers.micro import global_max, greedy_ranges, micro_batches


class Prompt:
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


def batch_of(prompts: list[Prompt], lengths: list[int], width: int = 8) -> Batch:
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).float()
    return Batch(tensors={"response_mask": mask, "row": torch.arange(len(lengths))}, objects={"prompt": prompts})


def test_row_micro_batches_are_plain_slices():
    a = Prompt(10)
    pieces = micro_batches(batch_of([a] * 5, [1] * 5), rows=2, budget=0, share_prompt=True, all_reduce=None)
    assert [p["row"].tolist() for p in pieces] == [[0, 1], [2, 3], [4]]


def test_a_budget_counts_a_shared_prompt_once():
    """Prompt a (10 tokens) x3 with responses 4, 4, 4; prompt b (6) x2 with 8, 1. Budget 22:
    shared: a+4+4+4 = 22 | b+8+1 = 15 -> two micro-batches; unshared: 14+14 = 28 > 22 -> one row each, then
    b rows 14 + 7 = 21."""
    a, b = Prompt(10), Prompt(6)
    batch = batch_of([a, a, a, b, b], [4, 4, 4, 8, 1])
    assert greedy_ranges(batch, 22, share_prompt=True) == [(0, 3), (3, 5)]
    assert greedy_ranges(batch, 22, share_prompt=False) == [(0, 1), (1, 2), (2, 3), (3, 5)]


def test_a_row_over_the_budget_stands_alone():
    a = Prompt(10)
    assert greedy_ranges(batch_of([a, a, a], [8, 8, 1]), 5, share_prompt=True) == [(0, 1), (1, 2), (2, 3)]


def test_every_rank_gets_the_largest_count():
    """This rank needs 2 micro-batches (a x3 = 22 tokens, b x3 = 9), another rank 4 (its one-hot is added by
    the fake all-reduce): this rank halves its heaviest micro-batch until it has 4, keeping the rows in order:
    (0-2) -> (0) (1-2) [14, 18 tokens] -> (1-2) -> (1) (2)."""
    other = torch.zeros(7, dtype=torch.float64)
    other[4] = 1.0
    assert global_max(2, 6, lambda t: t + other) == 4
    a, b = Prompt(10), Prompt(6)
    batch = batch_of([a, a, a, b, b, b], [4, 4, 4, 1, 1, 1])
    pieces = micro_batches(batch, rows=64, budget=22, share_prompt=True, all_reduce=lambda t: t + other)
    assert [p["row"].tolist() for p in pieces] == [[0], [1], [2], [3, 4, 5]]
