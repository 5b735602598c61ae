"""The FLOP account (mmrl.perf): the analytic counts against torch's counted forward on the tiny model, the
phases' sums against counts done by hand, and the measured peak."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mmrl.models.loading import load_model
from mmrl.perf.flops import GroupWork, generation_flops, groups_of, phase_flops, scoring_flops, update_flops
from mmrl.perf.mfu import group_peak, mfu_metrics
from mmrl.perf.peak import Peak, matmul_rate
from mmrl.perf.text import TextCosts, text_costs


@pytest.fixture(scope="module")
def eager_model(tiny_model_dir):
    """The tiny model with eager attention: its attention's matrix products are counted."""
    return load_model(tiny_model_dir, "float32", "eager", torch.device("cpu"))


def counted(run) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        run()
    return counter.get_total_flops()


def test_text_costs_are_a_counted_forward(eager_model):
    """One unpadded text row of T tokens through the whole model: dense * T + pair * T ** 2 (eager attention
    computes the full score matrix) + head * (positions with logits), for T = 5 and 40 so every term is pinned."""
    costs = text_costs(eager_model.config)
    for length in (5, 40):
        ids = torch.randint(10, 100, (1, length))
        assert counted(lambda ids=ids: eager_model(input_ids=ids, use_cache=False, logits_to_keep=0)) == (
            costs.dense * length + costs.pair * length**2 + costs.head * length)
        assert counted(lambda ids=ids: eager_model(input_ids=ids, use_cache=False, logits_to_keep=1)) == (
            costs.dense * length + costs.pair * length**2 + costs.head)


def test_generation_is_a_counted_prefill_and_decode(eager_model):
    """A prompt of P tokens prefilled, then its response decoded token by token from the cache, each forward
    counted: the decode's count equals the account's exactly (a fed token attends to every cached key), and the
    prefill's exceeds it by the masked half of its score matrix, which the account leaves out."""
    costs = text_costs(eager_model.config)
    prompt, extent = 9, 6
    ids = torch.randint(10, 100, (1, prompt))
    with torch.no_grad():
        out = eager_model(input_ids=ids, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values

    def decode() -> None:
        nonlocal cache
        for step in range(extent - 1):  # the last token is sampled but never fed back
            token = torch.tensor([[11 + step]])
            cache = eager_model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1
                                ).past_key_values

    decoded = counted(decode)
    prefilled = counted(lambda: eager_model(input_ids=ids, use_cache=True, logits_to_keep=1))
    group = GroupWork(prompt=prompt, grids=(), extents=(extent,), sampled=(extent,), turns=(1,))
    gen = generation_flops(costs, [group], [0])
    assert gen["gen/decode"] == decoded
    masked_half = prompt**2 - prompt * (prompt + 1) / 2
    assert gen["gen/prefill"] == prefilled - costs.pair * masked_half
    assert gen["gen/vision"] == 0


def test_phases_by_hand():
    """Two prompts (3 and 2 tokens) with responses of 2 + 1 and 4 tokens, costs dense 10, pair 1, head 100."""
    costs = TextCosts(dense=10, pair=1, head=100)
    groups = [GroupWork(3, (), (2, 1), (2, 1), (1, 1)), GroupWork(2, (), (4,), (4,), (1,))]
    # Causal pairs: the prompts 6 + 3; responses after them: 2*3 + 3, 1*3 + 1, 4*2 + 10.
    pairs = 6 + 3 + (6 + 3) + (3 + 1) + (8 + 10)
    score = scoring_flops(costs, groups, [7, 5])
    assert score == 10 * (3 + 3 + 2 + 4) + pairs + 100 * (3 + 4) + 12
    assert update_flops(costs, groups, [7, 5], epochs=2, lora=False, vision_trains=True) == 2 * 3 * score
    assert update_flops(costs, groups, [7, 5], epochs=1, lora=True, vision_trains=False) == (
        2 * 10 * 12 + 3 * pairs + 2 * 100 * 7 + 12)
    gen = generation_flops(costs, groups, [7, 5])
    # Prefill: each prompt once with its last logits; decode: responses' first extent - 1 tokens, token i
    # attending to the prompt and i + 1 keys (1 token: 3 + 1; none; 3 tokens: (2+1) + (2+2) + (2+3)).
    assert gen["gen/prefill"] == (10 * 3 + 6 + 100) + (10 * 2 + 3 + 100)
    assert gen["gen/decode"] == (10 + 4 + 100) + (3 * 10 + 12 + 3 * 100)
    assert gen["gen/vision"] == 12


def test_agent_turns_split_prefill_and_decode():
    """An episode of two turns, 10 response tokens of which 7 sampled: 5 fed back by the decode loop (sampled
    minus turns), 4 prefilled by its second turn (3 tool tokens, the first turn's last), the last never run; the
    attended pairs shared in proportion, their sum that of running 9 positions."""
    costs = TextCosts(dense=10, pair=1, head=100)
    group = GroupWork(4, (), (10,), (7,), (2,))
    gen = generation_flops(costs, [group], [0])
    run_pairs = 9 * 4 + 9 * 10 / 2
    assert gen["gen/decode"] == pytest.approx(10 * 5 + run_pairs * 5 / 9 + 100 * 5)
    assert gen["gen/prefill"] == pytest.approx((10 * 4 + 10 + 100) + 10 * 4 + run_pairs * 4 / 9 + 100)


def test_groups_of_a_batch():
    uids = ["b", "a", "b"]
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    policy = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    groups = groups_of(uids, torch.tensor([5, 7, 5]), mask, policy, [[(1, 4, 4)], [], [(1, 4, 4)]],
                       torch.tensor([2, 1, 1]))
    assert groups == [GroupWork(5, ((1, 4, 4),), (2, 1), (1, 1), (2, 1)), GroupWork(7, (), (3,), (3,), (1,))]


def test_phase_flops_adds_the_vision_tower(eager_model):
    """The vision tower's count (mmrl.perf.vision) enters each pass once per distinct prompt."""
    from mmrl.perf.vision import vision_flops

    with_image = GroupWork(20, ((1, 4, 4),), (3, 3), (3, 3), (1, 1))
    without = GroupWork(20, (), (3, 3), (3, 3), (1, 1))
    tower = vision_flops(eager_model.config, [(1, 4, 4)])
    assert tower > 0
    a, b = phase_flops(eager_model.config, [with_image]), phase_flops(eager_model.config, [without])
    assert a["gen/vision"] - b["gen/vision"] == tower
    assert a["old_log_prob"] - b["old_log_prob"] == tower
    assert a["update_actor"] - b["update_actor"] == 3 * tower
    assert a["gen"] == a["gen/vision"] + a["gen/prefill"] + a["gen/decode"]


def test_mfu_metrics():
    peak = group_peak([Peak(large=2e12, model=1e12), Peak(large=2e12, model=1e12)])
    out = mfu_metrics({"gen": 8e12, "ref": 1e12, "update_actor": 3e12}, {"gen": 4.0, "update_actor": 1.0,
                                                                          "step": 9.0}, peak)
    assert out == {"perf/mfu/gen": 0.5, "perf/tflop/gen": 8.0, "perf/mfu/update_actor": 0.75,
                   "perf/tflop/update_actor": 3.0}


def test_peak_is_measured_without_moving_the_run_s_random_stream():
    state = torch.get_rng_state()
    rate = matmul_rate(64, 64, 64, torch.device("cpu"), torch.float32, seconds=0.01)
    assert rate > 1e6  # FLOP/s: any machine that runs the suite
    assert torch.equal(torch.get_rng_state(), state)


def test_videos_and_tool_images_enter_the_vision_count(eager_model):
    """A prompt's video frames count once per group, like its images; a tool's returned images once per sample."""
    from mmrl.perf.flops import group_vision_flops
    from mmrl.perf.vision import vision_flops

    config = eager_model.config
    image, video, tool = (1, 4, 4), (2, 4, 4), (1, 4, 8)
    uids = ["a", "a", "a"]
    mask = torch.ones(3, 2)
    groups = groups_of(uids, torch.tensor([20, 20, 20]), mask, mask, [[image, video]] * 3, torch.tensor([2, 1, 2]),
                       [[tool], [], [tool, tool]])
    assert groups[0].tool_grids == ((tool,), (), (tool, tool))
    one = {g: vision_flops(config, [g]) for g in (image, video, tool)}
    assert one[video] > one[image] > 0
    expected = one[image] + one[video] + 3 * one[tool]
    assert group_vision_flops(config, groups[0]) == expected
    flops = phase_flops(config, groups)
    bare = phase_flops(config, [GroupWork(20, (), (2, 2, 2), (2, 2, 2), (2, 1, 2))])
    assert flops["gen/vision"] == expected
    assert flops["old_log_prob"] - bare["old_log_prob"] == expected
    assert flops["update_actor"] - bare["update_actor"] == 3 * expected
    without_tools = groups_of(uids, torch.tensor([20, 20, 20]), mask, mask, [[image, video]] * 3)
    assert without_tools[0].tool_grids == ()


def test_a_prompt_s_media_grids_are_its_images_then_its_videos():
    from mmrl.models.encoding import EncodedPrompt, media_grids

    ids = torch.zeros(3, dtype=torch.long)
    both = EncodedPrompt(ids, ids, image_grid_thw=torch.tensor([[1, 2, 4], [1, 4, 4]]),
                         video_grid_thw=torch.tensor([[3, 2, 2]]))
    assert media_grids(both) == [(1, 2, 4), (1, 4, 4), (3, 2, 2)]
    assert media_grids(EncodedPrompt(ids, ids)) == []
