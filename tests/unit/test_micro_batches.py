"""Micro-batches by rows or by a token budget (mmrl.workers.micro), checked by hand."""

from __future__ import annotations

import pytest
import torch

from mmrl.protocol import Batch
from mmrl.workers.micro import FILLER, global_max, greedy_ranges, micro_batches, mini_batches, split_to


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


def test_every_rank_gets_the_largest_count_without_cutting_a_prompt():
    """This rank needs 2 micro-batches (a x3 = 22 tokens, b x3 = 9), another rank 4 (its one-hot is added by
    the fake all-reduce): no range holds two prompts, so this rank runs 2 zero-weight fillers (a one-token
    text prompt, no media) rather than cut prompt a's samples in two."""
    other = torch.zeros(7, dtype=torch.float64)
    other[4] = 1.0
    assert global_max(2, 6, lambda t: t + other) == 4
    a, b = Prompt(10), Prompt(6)
    batch = batch_of([a, a, a, b, b, b], [4, 4, 4, 1, 1, 1])
    pieces = micro_batches(batch, rows=64, budget=22, share_prompt=True, all_reduce=lambda t: t + other)
    assert [p["row"].tolist() for p in pieces] == [[0, 1, 2], [3, 4, 5], [5], [5]]
    assert [bool(p.meta.get(FILLER)) for p in pieces] == [False, False, True, True]
    for piece in pieces[2:]:
        assert piece["response_mask"].sum() == 0 and len(piece["prompt"][0]) == 1


def test_a_range_of_several_prompts_is_split_between_them_first():
    """Budget 64 keeps a x2 | b x2 | c x1 in one range; a count of 3 splits it at prompt boundaries."""
    a, b, c = Prompt(10), Prompt(6), Prompt(3)
    batch = batch_of([a, a, b, b, c], [1, 1, 1, 1, 1])
    assert greedy_ranges(batch, 64, share_prompt=True) == [(0, 5)]
    assert split_to([(0, 5)], 3, batch, share_prompt=True) == [(0, 2), (2, 4), (4, 5)]


def test_row_micro_batches_keep_a_prompt_whole_and_pads_ride_free():
    """rows=4, prompts of 3 samples: plain slices would cut the second prompt; padding rows cost nothing."""
    a, b = Prompt(5), Prompt(5)
    batch = batch_of([a] * 3 + [b] * 5, [2] * 8)
    batch.tensors["is_pad"] = torch.tensor([False] * 6 + [True] * 2)
    pieces = micro_batches(batch, rows=4, budget=0, share_prompt=True, all_reduce=None)
    assert [p["row"].tolist() for p in pieces] == [[0, 1, 2], [3, 4, 5, 6, 7]]


def test_mini_batches_cut_between_prompts_near_equal_shares():
    a, b, c, d = (Prompt(1) for _ in range(4))
    batch = batch_of([a] * 3 + [b] * 3 + [c] * 2 + [d] * 4, [1] * 12)
    assert [p["row"].tolist() for p in mini_batches(batch, 2)] == [list(range(6)), list(range(6, 12))]
    assert [len(p) for p in mini_batches(batch, 3)] == [3, 5, 4]  # cuts at 3 and 8 (targets 4 and 8)
    single = batch_of([a] * 4, [1] * 4)
    assert [len(p) for p in mini_batches(single, 2)] == [2, 2]  # fewer prompts than pieces: by rows
