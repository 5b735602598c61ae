"""OTB, the optimal token baseline: against a plain loop over groups, positions and samples (holes, padding, a
group of one, rollout-correction weights, the zero tail), against values worked by hand, and as the algorithm
``otb`` reads the batch and its section."""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.algos import build_algorithm, key_owners
from mmrl.algos.otb import otb_advantages, token_energy
from mmrl.config import ConfigError, load_config
from mmrl.protocol import Batch
from mmrl.run_config import load_run_config

UIDS = ["a", "a", "a", "b", "b", "c", "d", "d"]
EXTENTS = [5, 3, 6, 4, 4, 2, 1, 6]  # response lengths; R = 6, so some rows are padded
HOLES = {0: [2], 2: [1, 2]}  # a tool's tokens inside rows 0 and 2


def batch_tensors(seed: int = 0):
    """float64 (B, R): rewards on each row's last policy token (plus a little everywhere, so that the returns-to-go
    vary), sampled-token log-probs, sums of squared probabilities at least the sampled token's square, importance
    weights, and the policy mask; garbage wherever the mask is 0."""
    gen = torch.Generator().manual_seed(seed)
    shape = (len(UIDS), max(EXTENTS))
    mask = torch.zeros(shape, dtype=torch.float64)
    for row, extent in enumerate(EXTENTS):
        mask[row, :extent] = 1
        mask[row, HOLES.get(row, [])] = 0
    rewards = 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
    for row in range(len(UIDS)):
        rewards[row, int(mask[row].nonzero().max())] += float(torch.randn(1, generator=gen))
    logp = -2 * torch.rand(shape, generator=gen, dtype=torch.float64)
    spread = torch.rand(shape, generator=gen, dtype=torch.float64) * (1 - logp.exp()) ** 2
    sum_sq = logp.exp() ** 2 + spread
    weights = 0.5 + torch.rand(shape, generator=gen, dtype=torch.float64)
    garbage = mask == 0
    for t in (rewards, logp, sum_sq, weights):
        t[garbage] = 7.0
    return rewards, mask, logp, sum_sq, weights


def loop_reference(rewards, mask, logp, sum_sq, weights, epsilon, zero_tail):
    """The formula on Python floats, one group, position and sample at a time."""
    rows, width = mask.shape
    on = [[bool(mask[i, t]) for t in range(width)] for i in range(rows)]
    returns = [[sum(float(rewards[i, u]) for u in range(t, width) if on[i][u]) if on[i][t] else 0.0
                for t in range(width)] for i in range(rows)]
    gathered = []
    for i in range(rows):
        total, row = 0.0, []
        for t in range(width):
            if on[i][t]:
                pi = math.exp(float(logp[i, t]))
                rho = 1.0 if weights is None else float(weights[i, t])
                total += (1 - 2 * pi + float(sum_sq[i, t])) * rho ** 2
            row.append(total if on[i][t] else 0.0)
        gathered.append(row)
    lengths = [max([t + 1 for t in range(width) if on[i][t]], default=0) for i in range(rows)]
    advantages = [[0.0] * width for _ in range(rows)]
    for uid in dict.fromkeys(UIDS):
        members = [i for i in range(rows) if UIDS[i] == uid]
        for t in range(width):
            if len(members) < 2:
                baseline = 0.0
            else:
                num = sum(returns[i][t] * gathered[i][t] for i in members)
                den = sum(gathered[i][t] for i in members) + epsilon
                baseline = num / den
            for i in members:
                b = baseline
                by_length = sorted((lengths[j] for j in members), reverse=True)
                if zero_tail and len(members) > 1 and lengths[i] == by_length[0] > by_length[1] and t >= by_length[1]:
                    b = 0.0
                advantages[i][t] = returns[i][t] - b if on[i][t] else 0.0
    return advantages, returns


@pytest.mark.parametrize("zero_tail", [False, True])
@pytest.mark.parametrize("with_weights", [False, True])
def test_otb_matches_the_loop(zero_tail, with_weights):
    rewards, mask, logp, sum_sq, weights = batch_tensors()
    weights = weights if with_weights else None
    adv, ret = otb_advantages(rewards, mask, UIDS, logp, sum_sq, is_weights=weights, epsilon=1e-8,
                              zero_tail=zero_tail)
    want_adv, want_ret = loop_reference(rewards, mask, logp, sum_sq, weights, 1e-8, zero_tail)
    assert adv.tolist() == [pytest.approx(row, rel=1e-12, abs=1e-12) for row in want_adv]
    assert ret.tolist() == [pytest.approx(row, rel=1e-12, abs=1e-12) for row in want_ret]
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)
    assert torch.equal(adv[5], ret[5])  # a group of one: no baseline


def test_the_zero_tail_changes_only_the_unique_longest_responses_tail():
    rewards, mask, logp, sum_sq, _ = batch_tensors()
    plain, _ = otb_advantages(rewards, mask, UIDS, logp, sum_sq)
    tail, returns = otb_advantages(rewards, mask, UIDS, logp, sum_sq, zero_tail=True)
    changed = (plain != tail).nonzero().tolist()
    # group a: row 2 (length 6) past row 0's 5; group d: row 7 (6) past row 6's 1; group b's two rows tie
    assert {row for row, _ in changed} == {2, 7} and all(t >= (5 if row == 2 else 1) for row, t in changed)
    assert torch.equal(tail[7, 1:], returns[7, 1:])


def test_otb_by_hand():
    """One group of two. Sample a: 2 tokens, reward 1 on the last, pi = 0.5 and sum pi^2 = 0.5 on each, so w = 0.5
    and W = (0.5, 1.0); G = (1, 1). Sample b: 1 token, reward 0, pi = 0.5, sum pi^2 = 0.25, so W = (0.25,); G = (0,).
    t = 0: B = (1 * 0.5 + 0 * 0.25) / 0.75 = 2/3; t = 1: only a, B = 1. A_a = (1/3, 0), A_b = (-2/3, 0)."""
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    logp = torch.full((2, 2), math.log(0.5))
    sum_sq = torch.tensor([[0.5, 0.5], [0.25, 9.0]])
    assert token_energy(logp, sum_sq)[0].tolist() == pytest.approx([0.5, 0.5])
    adv, ret = otb_advantages(rewards, mask, ["g", "g"], logp, sum_sq)
    assert ret.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert adv.tolist() == [pytest.approx([1 / 3, 0.0], abs=1e-6), pytest.approx([-2 / 3, 0.0], abs=1e-6)]
    adv, _ = otb_advantages(rewards, mask, ["g", "g"], logp, sum_sq, zero_tail=True)  # a is longer than b: its t=1
    assert adv[0].tolist() == pytest.approx([1 / 3, 1.0], abs=1e-6)
    weights = torch.tensor([[2.0, 1.0], [1.0, 1.0]])  # rho^2 = 4 on a's first token: W_a = (2.0, 2.5)
    adv, _ = otb_advantages(rewards, mask, ["g", "g"], logp, sum_sq, is_weights=weights)
    assert adv[:, 0].tolist() == pytest.approx([1 - 2.0 / 2.25, -2.0 / 2.25], abs=1e-6)


def test_the_otb_algorithm_reads_the_sampled_tokens_share_of_the_energy_and_its_section():
    rewards, mask, logp, _, _ = batch_tensors(seed=3)
    rewards, mask, logp = rewards.float(), mask.float(), logp.float()
    extent = torch.tensor([[1.0] * n + [0.0] * (mask.shape[1] - n) for n in EXTENTS])
    tensors = {"token_level_rewards": rewards, "response_mask": extent, "policy_mask": mask,
               "rollout_log_probs": logp}
    otb = build_algorithm(load_run_config(None, ["algorithm.name=otb", "algorithm.otb.zero_tail=true"]))
    got = otb.compute_advantages(Batch(tensors=dict(tensors), objects={"uid": UIDS}))
    want, returns = otb_advantages(rewards, mask, UIDS, logp, logp.exp() ** 2, zero_tail=True)
    assert torch.equal(got["advantages"], want) and torch.equal(got["returns"], returns)
    old = logp - 0.3 * mask  # the old log-probs, when the step has them, win over the engine's
    got = otb.compute_advantages(Batch(tensors={**tensors, "old_log_probs": old}, objects={"uid": UIDS}))
    assert torch.equal(got["advantages"], otb_advantages(rewards, mask, UIDS, old, old.exp() ** 2,
                                                         zero_tail=True)[0])


def test_otbs_keys_are_its_own_section():
    assert key_owners()["algorithm.otb.zero_tail"] == ["otb"]
    with pytest.raises(ConfigError, match="algorithm.otb.epsilon belongs to otb: algorithm.name=grpo"):
        load_run_config(None, ["algorithm.otb.epsilon=1e-6"])
    with pytest.raises(ConfigError, match="algorithm.otb.epsilon=0.0 must be > 0"):
        load_config(None, ["algorithm.name=otb", "algorithm.otb.epsilon=0"])
    with pytest.raises(ConfigError, match="rollout.n=1: otb compares the responses of one prompt"):
        load_run_config(None, ["algorithm.name=otb", "rollout.n=1"])
