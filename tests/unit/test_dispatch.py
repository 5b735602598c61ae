import itertools
import random

import pytest
import torch

from mmrl.controller.dispatch import (
    Dispatch,
    DispatchPlan,
    DispatchSpec,
    balanced_partition,
    collect,
    pad_to_multiple,
    register,
    split_args,
)
from mmrl.models.encoding import EncodedPrompt
from mmrl.protocol import Batch, sample_tokens


def batch(n: int) -> Batch:
    return Batch(tensors={"i": torch.arange(n)}, objects={"uid": [str(i) for i in range(n)]})


def prompt(length: int) -> EncodedPrompt:
    ids = torch.arange(length)
    return EncodedPrompt(input_ids=ids, mm_token_type_ids=torch.zeros_like(ids))


def samples(n: int, seed: int = 0) -> Batch:
    """n samples of varied token counts; consecutive pairs share one prompt object, as after rollout."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [prompt(int(torch.randint(1, 30, (1,), generator=gen))) for _ in range((n + 1) // 2)]
    lengths = torch.randint(0, 6, (n,), generator=gen)
    mask = (torch.arange(6) < lengths[:, None]).float()
    return Batch(
        tensors={
            "i": torch.arange(n),
            "response_mask": mask,
            "advantages": torch.randn(n, 6, generator=gen) * mask,
        },
        objects={"prompt": [prompts[i // 2] for i in range(n)], "uid": [f"u{i}" for i in range(n)]},
        meta={"step": 7},
    )


def loads(weights: list[int], parts: list[list[int]]) -> list[int]:
    return [sum(weights[i] for i in part) for part in parts]


def optimum(weights: list[int], num_parts: int) -> int:
    """Smallest possible max part weight over all partitions into equal-size parts (brute force)."""
    size = len(weights) // num_parts

    def best(rest: tuple[int, ...]) -> int:
        if not rest:
            return 0
        first, others = rest[0], rest[1:]
        loads_with = []
        for group in itertools.combinations(others, size - 1):
            rest_best = best(tuple(i for i in others if i not in group))
            loads_with.append(max(weights[first] + sum(weights[i] for i in group), rest_best))
        return min(loads_with)

    return best(tuple(range(len(weights))))


# ---- balanced_partition ------------------------------------------------------------------------


@pytest.mark.parametrize("n,parts", [(1, 1), (6, 3), (8, 2), (12, 4), (9, 9), (20, 5)])
def test_partition_has_equal_sizes_and_covers_every_index_once(n, parts):
    rng = random.Random(n)
    weights = [rng.randint(0, 100) for _ in range(n)]
    result = balanced_partition(weights, parts)
    assert len(result) == parts
    assert all(len(p) == n // parts for p in result)
    assert sorted(i for p in result for i in p) == list(range(n))
    assert all(p == sorted(p) for p in result)


def test_partition_is_deterministic_on_ties():
    assert balanced_partition([1] * 6, 3) == [[0, 3], [1, 4], [2, 5]]


def test_partition_places_heaviest_items_first():
    # In input order the greedy would give {1, 3} and {2, 6} (max 8); heaviest first reaches the optimum 7.
    result = balanced_partition([1, 2, 3, 6], 2)
    assert result == [[0, 3], [1, 2]]
    assert loads([1, 2, 3, 6], result) == [7, 5]


def test_partition_refuses_uneven_sizes():
    with pytest.raises(ValueError, match="equal size"):
        balanced_partition([1, 2, 3], 2)
    with pytest.raises(ValueError, match="positive"):
        balanced_partition([1, 2], 0)


def test_partition_beats_contiguous_chunks_on_a_skewed_batch():
    weights = [100, 90, 80, 70, 1, 1, 1, 1]
    result = balanced_partition(weights, 2)
    assert result == [[0, 3, 4, 6], [1, 2, 5, 7]]
    contiguous = loads(weights, [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert max(loads(weights, result)) < max(contiguous)
    assert max(loads(weights, result)) <= sum(weights) / 2 + max(weights)


@pytest.mark.parametrize("seed", range(20))
def test_partition_is_near_the_brute_force_optimum(seed):
    rng = random.Random(seed)
    num_parts = rng.choice([2, 3])
    size = rng.choice([2, 3, 4]) if num_parts == 2 else rng.choice([2, 3])
    weights = [rng.choice([rng.randint(0, 10), rng.randint(0, 1000)]) for _ in range(num_parts * size)]
    heuristic = max(loads(weights, balanced_partition(weights, num_parts)))
    best = optimum(weights, num_parts)
    assert best <= heuristic <= best + max(weights)
    assert heuristic <= sum(weights) / num_parts + max(weights)


# ---- padding -----------------------------------------------------------------------------------


def test_five_samples_over_two_ranks_get_three_each_with_one_zeroed_pad_row():
    original = samples(5)
    mask_before = original["response_mask"].clone()
    per_rank, plan = split_args(DispatchSpec(Dispatch.DP_COMPUTE), 2, (original,), {})
    parts = [args[0] for args, _ in per_rank]
    assert [len(p) for p in parts] == [3, 3]
    assert all(p["is_pad"].dtype == torch.bool and p["is_pad"].shape == (3,) for p in parts)
    pads = [(p, j) for p in parts for j in range(3) if p["is_pad"][j]]
    assert len(pads) == 1
    part, row = pads[0]
    assert part["i"][row] == part["i"][row - 1]  # a copy of the rank's own last sample (its prompt is there) ...
    assert part["response_mask"][row].sum() == 0  # ... weighing nothing
    assert part["advantages"][row].abs().sum() == 0
    assert sorted(s for sources in plan.sources for s in sources) == [-1, 0, 1, 2, 3, 4]
    assert sum(p["response_mask"].sum() for p in parts) == mask_before.sum()
    assert torch.equal(original["response_mask"], mask_before)  # the caller's batch is not touched
    assert "is_pad" not in original.keys()


def test_padding_cycles_from_sample_zero_and_zeroes_mask_and_advantages():
    weighted = {"response_mask": torch.ones(2, 3), "advantages": torch.ones(2, 3), "old_log_probs": torch.ones(2, 3)}
    b = Batch(tensors={"i": torch.arange(2), **weighted})
    padded = pad_to_multiple(b, 5)
    assert padded["i"].tolist() == [0, 1, 0, 1, 0]
    assert padded["is_pad"].tolist() == [False, False, True, True, True]
    assert padded["response_mask"].sum(-1).tolist() == [3, 3, 0, 0, 0]
    assert padded["advantages"].sum(-1).tolist() == [3, 3, 0, 0, 0]
    assert padded["old_log_probs"].sum(-1).tolist() == [3] * 5  # only what weights a loss is zeroed


def test_every_rank_gets_is_pad_even_without_padding():
    per_rank, plan = split_args(DispatchSpec(Dispatch.DP_COMPUTE), 2, (batch(4),), {})
    assert all(args[0]["is_pad"].tolist() == [False, False] for args, _ in per_rank)
    assert all(-1 not in sources for sources in plan.sources)


def test_more_ranks_than_samples_are_filled_with_padding():
    per_rank, plan = split_args(DispatchSpec(Dispatch.DP_COMPUTE), 4, (batch(1),), {})
    assert [len(args[0]) for args, _ in per_rank] == [1, 1, 1, 1]
    assert sum(int(args[0]["is_pad"].sum()) for args, _ in per_rank) == 3
    assert plan.num_samples == 1


def test_empty_batch_and_preset_is_pad_are_refused():
    with pytest.raises(ValueError, match="empty batch"):
        split_args(DispatchSpec(Dispatch.DP_COMPUTE), 2, (batch(0),), {})
    with pytest.raises(ValueError, match="is_pad"):
        split_args(DispatchSpec(Dispatch.DP_COMPUTE), 2, (Batch(tensors={"is_pad": torch.zeros(2, dtype=torch.bool)}),), {})


# ---- split + collect ---------------------------------------------------------------------------


def test_dp_compute_balances_ranks_by_tokens():
    heavy = [prompt(100), prompt(90), prompt(80), prompt(70)] + [prompt(1)] * 4
    b = Batch(objects={"prompt": heavy, "uid": [str(i) for i in range(8)]})
    per_rank, _ = split_args(DispatchSpec(Dispatch.DP_COMPUTE), 2, (b,), {})
    rank_loads = [sum(sample_tokens(args[0])) for args, _ in per_rank]
    assert rank_loads == [172, 172]  # contiguous chunks would give 340 and 4


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("n", range(1, 8))
def test_identity_worker_round_trips_exactly(world, n):
    original = samples(n, seed=n)
    per_rank, plan = split_args(DispatchSpec(Dispatch.DP_COMPUTE), world, (original, "extra"), {"k": 1})
    assert len({len(args[0]) for args, _ in per_rank}) == 1
    assert all(args[1] == "extra" and kw == {"k": 1} for args, kw in per_rank)
    for (args, _), sources in zip(per_rank, plan.sources, strict=True):  # each row is what the plan names
        rows = args[0]
        named = [-1 if pad else i for i, pad in zip(rows["i"].tolist(), rows["is_pad"].tolist())]
        assert named == list(sources)
    results = [  # an identity worker: its input, less is_pad
        Batch(tensors={k: v for k, v in b.tensors.items() if k != "is_pad"}, objects=b.objects, meta=b.meta)
        for b in (args[0] for args, _ in per_rank)
    ]
    back = collect(Dispatch.DP_COMPUTE, results, plan)
    assert set(back.tensors) == set(original.tensors) and set(back.objects) == set(original.objects)
    assert all(torch.equal(back[k], original[k]) for k in original.tensors)
    assert back["uid"] == original["uid"]
    assert all(a is b for a, b in zip(back["prompt"], original["prompt"], strict=True))
    assert back.meta == original.meta


def test_collect_drops_is_pad_a_worker_hands_back():
    per_rank, plan = split_args(DispatchSpec(Dispatch.DP_COMPUTE), 2, (batch(3),), {})
    back = collect(Dispatch.DP_COMPUTE, [args[0] for args, _ in per_rank], plan)
    assert back.keys() == ["i", "uid"]
    assert back["i"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("n,world,k", [(5, 2, 3), (7, 3, 2), (2, 4, 4), (6, 3, 1)])
def test_generate_like_worker_returns_blocks_in_original_order(n, world, k):
    per_rank, plan = split_args(DispatchSpec(Dispatch.DP_COMPUTE), world, (samples(n),), {})

    def generate(prompts: Batch) -> Batch:  # k samples per prompt, consecutively
        rows = prompts.repeat(k)
        out = rows["i"] * 10 + torch.arange(len(rows)) % k
        return Batch(tensors={"out": out}, objects={"uid": rows["uid"]})

    back = collect(Dispatch.DP_COMPUTE, [generate(args[0]) for args, _ in per_rank], plan)
    assert back["out"].tolist() == [i * 10 + s for i in range(n) for s in range(k)]
    assert back["uid"] == [f"u{i}" for i in range(n) for _ in range(k)]


def test_collect_refuses_rows_that_are_not_a_multiple_of_the_input():
    per_rank, plan = split_args(DispatchSpec(Dispatch.DP_COMPUTE), 2, (batch(4),), {})
    results = [Batch(tensors={"x": torch.zeros(3)}), Batch(tensors={"x": torch.zeros(2)})]
    with pytest.raises(ValueError, match="rank 0 returned 3 rows for 2 input rows"):
        collect(Dispatch.DP_COMPUTE, results, plan)
    with pytest.raises(ValueError, match="DispatchPlan"):
        collect(Dispatch.DP_COMPUTE, [Batch(tensors={"x": torch.zeros(2)})] * 2)


def test_dp_compute_needs_a_batch():
    with pytest.raises(TypeError, match="Batch"):
        split_args(DispatchSpec(Dispatch.DP_COMPUTE), 2, ([1, 2],), {})


def test_one_to_all_and_rank_zero():
    assert split_args(DispatchSpec(Dispatch.ONE_TO_ALL), 3, (1,), {}) == ([((1,), {})] * 3, None)
    assert split_args(DispatchSpec(Dispatch.RANK_ZERO), 2, (1,), {"a": 2}) == ([((1,), {"a": 2})] * 2, None)
    assert collect(Dispatch.ONE_TO_ALL, ["a", "b"]) == ["a", "b"]
    assert collect(Dispatch.RANK_ZERO, ["a", "b"]) == "a"
    plan = DispatchPlan(sources=((0,), (1,)), num_samples=2)
    assert collect(Dispatch.DP_COMPUTE, [{"m": 1}, {"m": 2}], plan) == [{"m": 1}, {"m": 2}]


def test_a_method_receives_only_the_fields_it_declares():
    b = Batch(
        tensors={"responses": torch.ones(4, 2), "response_mask": torch.ones(4, 2), "ref_log_probs": torch.zeros(4, 2)},
        objects={"images": [[b"png" * 100]] * 4, "answer": ["x"] * 4, "prompt": ["p"] * 4},
    )
    spec = DispatchSpec(Dispatch.DP_COMPUTE, fields=("prompt", "responses", "response_mask"),
                        optional=("ref_log_probs", "old_log_probs"))
    per_rank, _ = split_args(spec, 2, (b,), {})
    for (part, *_), _kwargs in per_rank:
        assert sorted(part.keys()) == ["is_pad", "prompt", "ref_log_probs", "response_mask", "responses"]
    with pytest.raises(KeyError, match="old_log_probs.*log-probs of the policy before the update"):
        split_args(DispatchSpec(Dispatch.DP_COMPUTE, fields=("old_log_probs",)), 2, (b,), {})


def test_fields_are_only_for_dp_compute():
    with pytest.raises(ValueError, match="DP_COMPUTE methods only"):
        register(Dispatch.ONE_TO_ALL, fields=("x",))
