import pytest
import torch

from mmrl.controller.dispatch import Dispatch, collect, split_args
from mmrl.protocol import Batch


def batch(n: int) -> Batch:
    return Batch(tensors={"i": torch.arange(n)}, objects={"uid": [str(i) for i in range(n)]})


@pytest.mark.parametrize("n,world,sizes", [(8, 2, [4, 4]), (7, 2, [4, 3]), (10, 4, [3, 3, 2, 2]), (3, 3, [1, 1, 1])])
def test_dp_compute_splits_in_order_and_collects_back(n, world, sizes):
    per_rank = split_args(Dispatch.DP_COMPUTE, world, (batch(n), "extra"), {"k": 1})
    assert [len(args[0]) for args, _ in per_rank] == sizes
    assert all(args[1] == "extra" and kw == {"k": 1} for args, kw in per_rank)
    # Each rank "computes" i * 10 on its chunk; collecting must restore the global order.
    results = [Batch(tensors={"out": args[0]["i"] * 10}) for args, _ in per_rank]
    assert collect(Dispatch.DP_COMPUTE, results)["out"].tolist() == [i * 10 for i in range(n)]


def test_dp_compute_refuses_fewer_samples_than_ranks():
    with pytest.raises(ValueError, match="cannot be split over 4 workers"):
        split_args(Dispatch.DP_COMPUTE, 4, (batch(3),), {})


def test_dp_compute_needs_a_batch():
    with pytest.raises(TypeError, match="Batch"):
        split_args(Dispatch.DP_COMPUTE, 2, ([1, 2],), {})


def test_one_to_all_and_rank_zero():
    assert split_args(Dispatch.ONE_TO_ALL, 3, (1,), {}) == [((1,), {})] * 3
    assert collect(Dispatch.ONE_TO_ALL, ["a", "b"]) == ["a", "b"]
    assert collect(Dispatch.RANK_ZERO, ["a", "b"]) == "a"
    assert collect(Dispatch.DP_COMPUTE, [{"m": 1}, {"m": 2}]) == [{"m": 1}, {"m": 2}]
