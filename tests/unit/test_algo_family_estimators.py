"""REINFORCE++, ReMax, KL-in-reward and its controllers, response filters and VAPO's GAE variants,
each checked against a plain per-sample, per-token Python loop reference and a few hand-computed values."""

import math

import pytest
import torch

from mmrl.algos.filters import group_win_rates, mixed_groups, pf_ppo_filter
from mmrl.algos.kl_control import AdaptiveKLController, FixedKLController, kl_in_reward
from mmrl.algos.ppo import gae, gae_advantages
from mmrl.algos.reinforce_pp import reinforce_pp_advantages, reinforce_pp_baseline_advantages, returns_to_go
from mmrl.algos.remax import remax_advantages
from mmrl.algos.vapo import decoupled_gae, length_adaptive_lambda

R = 6
LENGTHS = [1, 3, R, 4, 2, 6, 1]
UIDS = ["a", "a", "b", "a", "c", "b", "d"]  # group d and c are singletons


def ragged_mask(lengths: list[int], width: int = R) -> torch.Tensor:
    return torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths], dtype=torch.float64)


def ragged_inputs(seed: int, lengths: list[int] = LENGTHS, garbage: float = 1e3) -> tuple[torch.Tensor, ...]:
    """Random rewards and values with loud garbage on the padding (which must be ignored), and the mask."""
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(lengths)
    rewards = torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    values = torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    rewards = torch.where(mask > 0, rewards, torch.full_like(rewards, garbage))
    values = torch.where(mask > 0, values, torch.full_like(values, -garbage))
    return rewards, values, mask


def row(t: torch.Tensor, b: int, n: int) -> list[float]:
    return [float(x) for x in t[b, :n]]


def whiten_reference(rows: list[list[float]]) -> list[list[float]]:
    """Whiten the valid entries of all rows together: sample mean, unbiased variance (0 below two entries)."""
    flat = [x for r in rows for x in r]
    mean = sum(flat) / len(flat)
    var = sum((x - mean) ** 2 for x in flat) / (len(flat) - 1) if len(flat) > 1 else 0.0
    return [[(x - mean) / math.sqrt(var + 1e-8) for x in r] for r in rows]


def assert_rows(
    actual: torch.Tensor, expected_rows: list[list[float]], lengths: list[int], tol: float = 1e-6
) -> None:
    """Row b of ``actual`` is ``expected_rows[b]`` on its valid prefix and exactly 0 on its padding."""
    assert actual.shape == (len(lengths), R)
    for b, n in enumerate(lengths):
        assert row(actual, b, n) == pytest.approx(expected_rows[b], abs=tol), b
        assert actual[b, n:].tolist() == [0.0] * (R - n), b


def returns_reference(rewards: list[float], gamma: float) -> list[float]:
    """Direct sums G_t = sum_{k >= t} gamma^(k - t) r_k over one row's valid rewards."""
    n = len(rewards)
    return [sum(gamma ** (k - t) * rewards[k] for k in range(t, n)) for t in range(n)]


def group_members(uids: list[str], i: int) -> list[int]:
    return [j for j, u in enumerate(uids) if u == uids[i]]


# ---------------------------------------------------------------- REINFORCE++


def test_returns_to_go_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 7.0], [2.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    ret = returns_to_go(rewards, mask, 0.5)
    # row 0: [.25, .5, 1]; row 1 ignores the 7 on padding: [.5, 1, 0]; row 2: one token, [2, 0, 0]
    assert ret.tolist() == [[0.25, 0.5, 1.0], [0.5, 1.0, 0.0], [2.0, 0.0, 0.0]]


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_reinforce_pp_against_loop_reference(gamma):
    rewards, _, mask = ragged_inputs(1)
    adv, ret = reinforce_pp_advantages(rewards, mask, gamma)
    expected_ret = [returns_reference(row(rewards, b, n), gamma) for b, n in enumerate(LENGTHS)]
    assert_rows(ret, expected_ret, LENGTHS)
    assert_rows(adv, whiten_reference(expected_ret), LENGTHS, tol=1e-5)


def test_reinforce_pp_ignores_non_finite_padding_and_keeps_no_grad():
    rewards, _, mask = ragged_inputs(2, garbage=float("nan"))
    rewards.requires_grad_(True)
    adv, ret = reinforce_pp_advantages(rewards, mask, 0.95)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert not adv.requires_grad and not ret.requires_grad


def test_reinforce_pp_outcome_reward_by_hand():
    # outcome rewards on the last token, gamma 1: every token's return is the row's score
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = reinforce_pp_advantages(rewards, mask, 1.0)
    assert ret.tolist() == [[1.0, 1.0, 1.0], [3.0, 3.0, 0.0]]
    # valid returns [1, 1, 1, 3, 3]: mean 1.8, unbiased var (3 * .64 + 2 * 1.44) / 4 = 1.2
    std = math.sqrt(1.2)
    expected = [[-0.8 / std] * 3, [1.2 / std, 1.2 / std, 0.0]]
    assert adv.tolist() == [pytest.approx(expected[0], abs=1e-6), pytest.approx(expected[1], abs=1e-6)]


def test_reinforce_pp_all_equal_returns_give_zero_advantages():
    lengths = [1, 1, 1]  # one-token responses, all with the same reward
    mask = ragged_mask(lengths)
    rewards = mask * 2.0
    adv, ret = reinforce_pp_advantages(rewards, mask, 0.9)
    assert_rows(ret, [[2.0]] * 3, lengths)
    assert_rows(adv, [[0.0]] * 3, lengths)


def baseline_reference(rewards: torch.Tensor, lengths: list[int], uids: list[str]) -> list[list[float]]:
    scores = [sum(row(rewards, b, n)) for b, n in enumerate(lengths)]
    out = []
    for i, n in enumerate(lengths):
        group = group_members(uids, i)
        centred = 0.0 if len(group) == 1 else scores[i] - sum(scores[j] for j in group) / len(group)
        out.append([centred] * n)
    return out


def test_reinforce_pp_baseline_against_loop_reference():
    rewards, _, mask = ragged_inputs(3)
    adv, ret = reinforce_pp_baseline_advantages(rewards, mask, UIDS)
    expected_ret = baseline_reference(rewards, LENGTHS, UIDS)
    assert_rows(ret, expected_ret, LENGTHS, tol=1e-5)
    assert_rows(adv, whiten_reference(expected_ret), LENGTHS, tol=1e-4)


def test_reinforce_pp_baseline_by_hand():
    # scores: row 0 = 1, row 1 = 0 (group g, mean .5), row 2 = 5 (singleton)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 4.0], [5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    adv, ret = reinforce_pp_baseline_advantages(rewards, mask, ["g", "g", "s"])
    assert ret.tolist() == [[0.5, 0.5], [-0.5, 0.0], [0.0, 0.0]]
    # valid [.5, .5, -.5, 0]: mean .125, squared deviations .140625 * 2 + .390625 + .015625 = .6875,
    # unbiased var .6875 / 3
    std = math.sqrt(0.6875 / 3)
    expected = [[0.375 / std, 0.375 / std], [-0.625 / std, 0.0], [-0.125 / std, 0.0]]
    for b in range(3):
        assert adv[b].tolist() == pytest.approx(expected[b], abs=1e-5)


def test_reinforce_pp_baseline_all_equal_scores_and_singletons_are_zero():
    lengths = [2, 1, 3, 1]
    mask = ragged_mask(lengths)
    rewards = torch.zeros_like(mask)
    for b, n in enumerate(lengths):
        rewards[b, n - 1] = 1.0
    adv, ret = reinforce_pp_baseline_advantages(rewards, mask, ["x", "x", "x", "lonely"])
    assert_rows(ret, [[0.0] * n for n in lengths], lengths)
    assert_rows(adv, [[0.0] * n for n in lengths], lengths)


# ---------------------------------------------------------------- ReMax


def test_remax_against_loop_reference():
    rewards, _, mask = ragged_inputs(4)
    baseline = torch.randn(len(LENGTHS), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    adv, ret = remax_advantages(rewards, mask, baseline)
    expected_ret = [returns_reference(row(rewards, b, n), 1.0) for b, n in enumerate(LENGTHS)]
    assert_rows(ret, expected_ret, LENGTHS)
    expected_adv = [[g - float(baseline[b]) for g in expected_ret[b]] for b in range(len(LENGTHS))]
    assert_rows(adv, expected_adv, LENGTHS)


def test_remax_by_hand_is_not_whitened():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv, ret = remax_advantages(rewards, mask, torch.tensor([1.0, 0.25, -0.5]))
    assert ret.tolist() == [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert adv.tolist() == [[0.0, 0.0, 0.0], [0.75, 0.0, 0.0], [0.5, 0.5, 0.5]]


# ---------------------------------------------------------------- KL in the reward


def kl_reference(logp: float, ref: float, estimator: str) -> float:
    d = logp - ref
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    x = -d
    if estimator == "low_var_kl":
        x = min(max(x, -20.0), 20.0)
        return min(max(math.exp(x) - x - 1, -10.0), 10.0)
    return math.exp(x) - x - 1


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_in_reward_against_loop_reference(estimator):
    rewards, _, mask = ragged_inputs(6)
    gen = torch.Generator().manual_seed(7)
    logp = -torch.rand(mask.shape, generator=gen, dtype=torch.float64) * 3
    ref = -torch.rand(mask.shape, generator=gen, dtype=torch.float64) * 3
    logp[1, 0] = -15.0  # a large gap, where low_var_kl's clamp takes over
    logp = torch.where(mask > 0, logp, torch.full_like(logp, -math.inf))  # garbage log-probs on padding
    new, mean_kl = kl_in_reward(rewards, logp, ref, mask, 0.3, estimator)
    per_seq = []
    for b, n in enumerate(LENGTHS):
        kls = [kl_reference(float(logp[b, t]), float(ref[b, t]), estimator) for t in range(n)]
        per_seq.append(sum(kls) / n)
        expected = [float(rewards[b, t]) - 0.3 * kls[t] for t in range(n)]
        assert row(new, b, n) == pytest.approx(expected, abs=1e-9)
        assert new[b, n:].tolist() == rewards[b, n:].tolist()  # padding keeps its reward
    assert isinstance(mean_kl, float)
    assert mean_kl == pytest.approx(sum(per_seq) / len(per_seq), abs=1e-9)


def test_kl_in_reward_by_hand_and_unknown_estimator():
    rewards = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    logp = torch.tensor([[0.0, -1.0], [-0.5, 3.0]])
    ref = torch.tensor([[-1.0, -1.0], [-1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    new, mean_kl = kl_in_reward(rewards, logp, ref, mask, 0.5, "k1")
    # k1 kl: row 0 [1, 0] (mean .5); row 1 [.5] (mean .5), its padding's 3 is ignored
    assert new.tolist() == [[-0.5, 1.0], [1.75, 0.0]]
    assert mean_kl == pytest.approx(0.5)
    with pytest.raises(ValueError, match="k3"):
        kl_in_reward(rewards, logp, ref, mask, 0.5, "k7")


def test_fixed_kl_controller_never_moves():
    ctl = FixedKLController(0.05)
    for kl in (0.0, 1.0, 100.0):
        ctl.update(kl, 256)
    assert ctl.value == 0.05


def test_adaptive_kl_controller_by_hand():
    ctl = AdaptiveKLController(0.1, target_kl=6.0, horizon=10000)
    ctl.update(9.0, 256)  # error 9/6 - 1 = .5, clipped to .2
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10000))
    v = ctl.value
    ctl.update(6.6, 1000)  # error .1, inside the clip
    assert ctl.value == pytest.approx(v * (1 + 0.1 * 1000 / 10000))
    v = ctl.value
    ctl.update(0.0, 5000)  # error -1, clipped to -.2
    assert ctl.value == pytest.approx(v * (1 - 0.2 * 5000 / 10000))
    v = ctl.value
    ctl.update(6.0, 5000)  # on target: unchanged
    assert ctl.value == pytest.approx(v)


@pytest.mark.parametrize("target, horizon, match", [(0.0, 10, "target_kl"), (-1.0, 10, "target_kl"),
                                                    (1.0, 0, "horizon"), (1.0, -5, "horizon")])
def test_adaptive_kl_controller_validates(target, horizon, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveKLController(0.1, target_kl=target, horizon=horizon)


# ---------------------------------------------------------------- filters


def mixed_reference(scores: list[float], uids: list[str]) -> list[bool]:
    keep = []
    for i in range(len(scores)):
        vals = [scores[j] for j in group_members(uids, i)]
        keep.append(len(vals) == 1 or max(vals) - min(vals) > 1e-9)
    return keep


def test_mixed_groups_by_hand():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.5, 0.5 + 1e-12, 0.3, 0.3 + 1e-6], dtype=torch.float64)
    uids = ["a", "a", "b", "b", "lone", "c", "c", "d", "d"]
    keep = mixed_groups(scores, uids)
    assert keep.dtype == torch.bool
    # a: all agree -> dropped; b: mixed -> kept; singleton kept; c agrees within 1e-9; d differs by 1e-6
    assert keep.tolist() == [False, False, True, True, True, False, False, True, True]


def test_mixed_groups_against_loop_reference():
    gen = torch.Generator().manual_seed(8)
    scores = torch.randint(0, 2, (40,), generator=gen).float()  # binary rewards: many uniform groups
    uids = [str(int(g)) for g in torch.randint(0, 12, (40,), generator=gen)] + ["single"]
    scores = torch.cat([scores, torch.tensor([1.0])])
    assert mixed_groups(scores, uids).tolist() == mixed_reference(scores.tolist(), uids)


def rank_in_group(scores: list[float], uids: list[str], i: int) -> int:
    """Place of sample i in its group's ranking (best first, ties to the lower index)."""
    group = group_members(uids, i)
    return sum(1 for j in group if scores[j] > scores[i] or (scores[j] == scores[i] and j < i))


@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_pf_ppo_best_k_against_loop_reference(k):
    gen = torch.Generator().manual_seed(9)
    scores = torch.randint(0, 4, (30,), generator=gen).float()  # coarse scores: plenty of ties
    uids = [str(i % 7) for i in range(30)] + ["single"]
    scores = torch.cat([scores, torch.tensor([0.0])])
    keep = pf_ppo_filter(scores, uids, "best_k", k)
    s = scores.tolist()
    assert keep.tolist() == [rank_in_group(s, uids, i) < k for i in range(len(s))]


def test_pf_ppo_best_and_worst_against_loop_reference():
    gen = torch.Generator().manual_seed(10)
    scores = torch.randint(0, 3, (30,), generator=gen).float()
    uids = [str(i % 6) for i in range(30)] + ["single"]
    scores = torch.cat([scores, torch.tensor([2.0])])
    keep = pf_ppo_filter(scores, uids, "best_and_worst", 1)
    s = scores.tolist()
    expected = []
    for i in range(len(s)):
        rank, size = rank_in_group(s, uids, i), len(group_members(uids, i))
        expected.append(rank == 0 or rank == size - 1)
    assert keep.tolist() == expected
    assert keep[-1]  # a group of one keeps its sample


def test_pf_ppo_by_hand_ties_go_to_the_lower_index():
    scores = torch.tensor([0.5, 1.0, 0.5, 1.0, 0.0, 7.0])
    uids = ["g", "g", "g", "g", "g", "one"]
    assert pf_ppo_filter(scores, uids, "best_k", 1).tolist() == [False, True, False, False, False, True]
    assert pf_ppo_filter(scores, uids, "best_k", 3).tolist() == [True, True, False, True, False, True]
    best_and_worst = pf_ppo_filter(scores, uids, "best_and_worst", 1)
    assert best_and_worst.tolist() == [False, True, False, False, True, True]
    # all equal: the best is the first, the worst the last of the (stable) ranking
    flat = torch.zeros(4)
    assert pf_ppo_filter(flat, ["u"] * 4, "best_and_worst", 1).tolist() == [True, False, False, True]
    assert pf_ppo_filter(flat, ["u"] * 4, "best_k", 2).tolist() == [True, True, False, False]


def test_pf_ppo_k_at_least_the_group_keeps_it_whole():
    scores = torch.tensor([0.1, 0.9, 0.4, 0.2, 0.3])
    uids = ["a", "a", "a", "b", "b"]
    for mode in ("best_k", "random"):
        assert pf_ppo_filter(scores, uids, mode, 3, torch.Generator().manual_seed(0)).all()


def test_pf_ppo_random_keeps_k_per_group_and_is_reproducible():
    uids = [str(i % 5) for i in range(40)] + ["single"]
    scores = torch.arange(41, dtype=torch.float32)
    first = pf_ppo_filter(scores, uids, "random", 3, torch.Generator().manual_seed(11))
    again = pf_ppo_filter(scores, uids, "random", 3, torch.Generator().manual_seed(11))
    assert first.tolist() == again.tolist()
    for g in set(uids):
        kept = sum(1 for i, u in enumerate(uids) if u == g and first[i])
        assert kept == min(3, uids.count(g)), g
    others = [pf_ppo_filter(scores, uids, "random", 3, torch.Generator().manual_seed(s)).tolist()
              for s in range(5)]
    assert any(o != first.tolist() for o in others)  # the seed matters


def test_pf_ppo_random_is_uniform_within_a_group():
    gen = torch.Generator().manual_seed(12)
    scores = torch.tensor([3.0, 2.0, 1.0, 0.0])  # the scores must not matter
    counts = [0, 0, 0, 0]
    draws = 2000
    for _ in range(draws):
        for i, kept in enumerate(pf_ppo_filter(scores, ["g"] * 4, "random", 1, gen).tolist()):
            counts[i] += kept
    assert sum(counts) == draws
    assert all(abs(c / draws - 0.25) < 0.04 for c in counts), counts


def test_pf_ppo_rejects_unknown_modes_and_bad_k():
    scores, uids = torch.zeros(2), ["a", "a"]
    with pytest.raises(ValueError, match="best_k.*best_and_worst.*random"):
        pf_ppo_filter(scores, uids, "top", 1)
    with pytest.raises(ValueError, match="k"):
        pf_ppo_filter(scores, uids, "best_k", 0)


def win_rate_reference(scores: list[float], uids: list[str]) -> list[float]:
    out = []
    for i in range(len(scores)):
        others = [j for j in group_members(uids, i) if j != i]
        if not others:
            out.append(0.5)
            continue
        wins = 0.0
        for j in others:
            wins += 1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
        out.append(wins / len(others))
    return out


def test_group_win_rates_by_hand():
    scores = torch.tensor([1.0, 2.0, 2.0, 0.0, 4.0, 3.0, 3.0])
    uids = ["a", "a", "a", "a", "solo", "tie", "tie"]
    rates = group_win_rates(scores, uids)
    # 1 beats only 0: 1/3; each 2 beats 1 and 0 and ties the other 2: 2.5/3; 0 beats nothing
    expected = [1 / 3, 2.5 / 3, 2.5 / 3, 0.0, 0.5, 0.5, 0.5]
    assert rates.tolist() == pytest.approx(expected)


def test_group_win_rates_against_loop_reference():
    gen = torch.Generator().manual_seed(13)
    scores = torch.randint(0, 5, (50,), generator=gen).float()
    uids = [str(int(g)) for g in torch.randint(0, 9, (50,), generator=gen)] + ["x"]
    scores = torch.cat([scores, torch.tensor([1.0])])
    rates = group_win_rates(scores, uids)
    assert rates.tolist() == pytest.approx(win_rate_reference(scores.tolist(), uids))
    # within each group the win rates average to 1/2 (every comparison is counted from both sides)
    for g in set(uids):
        idx = [i for i, u in enumerate(uids) if u == g]
        assert sum(float(rates[i]) for i in idx) / len(idx) == pytest.approx(0.5)


def test_length_adaptive_lambda_by_hand_and_against_loop_reference():
    lam = length_adaptive_lambda(torch.tensor([0, 1, 20, 40, 100]), alpha=0.05)
    # 1 - 1/(.05 n): n=0 -> as 1 -> -19 -> 0; 20 -> 0; 40 -> .5; 100 -> .8
    assert lam.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.5, 0.8])
    lengths = [0, 1, 2, 3, 7, 50, 1000]
    lam = length_adaptive_lambda(torch.tensor(lengths), alpha=0.7)
    expected = [min(max(1 - 1 / (0.7 * max(n, 1)), 0.0), 1.0) for n in lengths]
    assert lam.tolist() == pytest.approx(expected, abs=1e-6)
    # with a large alpha a one-token response already has a positive lambda, and length 0 counts as 1
    lam = length_adaptive_lambda(torch.tensor([0, 1, 2]), alpha=4.0)
    assert lam.tolist() == pytest.approx([0.75, 0.75, 0.875])
    with pytest.raises(ValueError, match="alpha"):
        length_adaptive_lambda(torch.tensor([3]), alpha=0.0)


def gae_reference(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """Direct sums A_t = sum_l (gamma lam)^l delta_{t+l}, with the value after the last token 0."""
    n = len(rewards)
    deltas = [rewards[t] + gamma * (values[t + 1] if t + 1 < n else 0.0) - values[t] for t in range(n)]
    return [sum((gamma * lam) ** (k - t) * deltas[k] for k in range(t, n)) for t in range(n)]


PER_ROW_LAM = [0.0, 0.5, 0.95, 1.0, 0.3, 0.8, 0.99]


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_gae_with_a_lambda_per_row_against_loop_reference(gamma):
    rewards, values, mask = ragged_inputs(14)
    adv, _ = gae(rewards, values, mask, gamma, torch.tensor(PER_ROW_LAM))
    expected = [gae_reference(row(rewards, b, n), row(values, b, n), gamma, PER_ROW_LAM[b])
                for b, n in enumerate(LENGTHS)]
    assert_rows(adv, expected, LENGTHS)


def test_gae_with_a_lambda_per_row_by_hand():
    rewards = torch.tensor([[0.0, 1.0, 5.0], [2.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 9.0], [1.0, 4.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv, _ = gae(rewards, values, mask, 1.0, torch.tensor([0.5, 1.0]))
    # row 0: delta1 = 1 - .2 = .8, delta0 = 0 + .2 - .5 = -.3, A0 = -.3 + .5 * .8 = .1
    # row 1 (one token): delta0 = 2 - 1 = 1
    assert adv.tolist() == [pytest.approx([0.1, 0.8, 0.0]), pytest.approx([1.0, 0.0, 0.0])]


def test_gae_with_a_constant_lambda_per_row_matches_ppo():
    rewards, values, mask = ragged_inputs(15)
    raw, _ = gae(rewards, values, mask, 0.97, torch.full((len(LENGTHS),), 0.9))
    ppo_adv, ppo_ret = gae_advantages(rewards, values, mask, 0.97, 0.9)
    expected = [gae_reference(row(rewards, b, n), row(values, b, n), 0.97, 0.9)
                for b, n in enumerate(LENGTHS)]
    assert_rows(raw, expected, LENGTHS)
    assert_rows(ppo_adv, whiten_reference(expected), LENGTHS, tol=1e-5)


def test_decoupled_gae_against_loop_reference():
    rewards, values, mask = ragged_inputs(16)
    lam_actor = torch.tensor(PER_ROW_LAM, dtype=torch.float64)
    adv, ret = decoupled_gae(rewards, values, mask, 0.99, 1.0, lam_actor)
    expected_ret, raw_actor = [], []
    for b, n in enumerate(LENGTHS):
        r, v = row(rewards, b, n), row(values, b, n)
        critic = gae_reference(r, v, 0.99, 1.0)
        expected_ret.append([critic[t] + v[t] for t in range(n)])
        raw_actor.append(gae_reference(r, v, 0.99, PER_ROW_LAM[b]))
    assert_rows(ret, expected_ret, LENGTHS)
    assert_rows(adv, whiten_reference(raw_actor), LENGTHS, tol=1e-5)
    assert not adv.requires_grad and not ret.requires_grad


def test_decoupled_gae_by_hand():
    rewards = torch.tensor([[0.0, 1.0], [3.0, 0.0]])
    values = torch.tensor([[0.5, 0.2], [1.0, 8.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, ret = decoupled_gae(rewards, values, mask, 1.0, 1.0, torch.tensor([0.0, 0.0]))
    # critic, lambda 1 and gamma 1: the returns are the plain returns-to-go, [1, 1] and [3]
    assert ret.tolist() == [pytest.approx([1.0, 1.0]), pytest.approx([3.0, 0.0])]
    # actor, lambda 0: the one-step deltas [-.3, .8] and [2]; mean 2.5 / 3, then whitened
    raw = [-0.3, 0.8, 2.0]
    mean = sum(raw) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in raw) / 2)
    expected = [[(raw[0] - mean) / std, (raw[1] - mean) / std], [(raw[2] - mean) / std, 0.0]]
    assert adv.tolist() == [pytest.approx(expected[0], abs=1e-5), pytest.approx(expected[1], abs=1e-5)]


def test_decoupled_gae_with_one_token_responses():
    lengths = [1, 1, 1, 1]
    rewards, values, mask = ragged_inputs(17, lengths)
    lam_actor = length_adaptive_lambda(torch.tensor(lengths), 0.5)
    adv, ret = decoupled_gae(rewards, values, mask, 0.9, 0.95, lam_actor)
    # one token: the return is its reward whatever the lambdas, the advantage its whitened r - V
    assert_rows(ret, [[float(rewards[b, 0])] for b in range(4)], lengths)
    raw = [[float(rewards[b, 0] - values[b, 0])] for b in range(4)]
    assert_rows(adv, whiten_reference(raw), lengths, tol=1e-5)
