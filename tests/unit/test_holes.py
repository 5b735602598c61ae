"""Trajectories with holes (tokens the policy did not sample): every per-token computation against a plain
loop over the policy's tokens only, on ragged batches with holes and garbage wherever the policy mask is 0;
and, on batches without holes, bit-identical results to the code before holes existed (copied below)."""

import math

import pytest
import torch

from mmrl import trajectory
from mmrl.algos import ALGORITHMS
from mmrl.algos.filters import group_win_rates
from mmrl.algos.grpo import grpo_advantages
from mmrl.algos.kl_control import kl_in_reward
from mmrl.algos.aggregation import aggregate
from mmrl.algos.kl import kl_penalty
from mmrl.algos.losses import LOSSES
from mmrl.algos.losses.gspo import gspo_loss
from mmrl.algos.losses.positive_lm import positive_lm_loss
from mmrl.algos.losses.ppo_clip import ppo_clip_loss
from mmrl.algos.losses.sppo import SPPOConfig, sppo_loss
from mmrl.algos.masked import masked_whiten
from mmrl.algos.pass_at_k import PassAtKConfig
from mmrl.algos.ppo import gae, gae_advantages
from mmrl.algos.rloo import rloo_advantages
from mmrl.algos.reinforce_pp import reinforce_pp_advantages, reinforce_pp_baseline_advantages, returns_to_go
from mmrl.algos.remax import remax_advantages
from mmrl.algos.value_loss import value_loss
from mmrl.algos.vapo import VAPOConfig, decoupled_gae, length_adaptive_lambda
from mmrl.config import ActorConfig, AlgorithmConfig, LossConfig
from mmrl.protocol import Batch
from mmrl.trainer.metrics import non_finite, step_metrics, value_metrics

R = 7
# extent lengths and the holes of each row: one hole; several (a run of two); a hole at the end of the
# response; all hole but one token; no hole (one token); no hole; a full-width row with a hole, no padding
LENGTHS = [6, 6, 5, 4, 1, 3, 7]
HOLES = [[2], [1, 2, 4], [4], [0, 1, 3], [], [], [3]]
UIDS = ["a", "a", "b", "a", "b", "c", "b"]
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def masks(lengths=LENGTHS, holes=HOLES, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """(response_mask, policy_mask), each (B, R)."""
    extent = torch.tensor([[1.0] * n + [0.0] * (R - n) for n in lengths], dtype=dtype)
    policy = extent.clone()
    for b, hs in enumerate(holes):
        policy[b, hs] = 0.0
    return extent, policy


def policy_positions(policy: torch.Tensor) -> list[list[int]]:
    return [[t for t in range(policy.shape[1]) if policy[b, t] > 0] for b in range(policy.shape[0])]


def randn(seed: int, policy: torch.Tensor, garbage: float | None = float("nan"), dtype=torch.float64) -> torch.Tensor:
    """Random (B, R) values with ``garbage`` wherever ``policy`` is 0 (holes and padding)."""
    x = torch.randn(policy.shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return x if garbage is None else torch.where(policy > 0, x, torch.full_like(x, garbage))


def on_policy(rows: list[list[float]], policy: torch.Tensor) -> list[list[float]]:
    """Per-policy-token lists -> full (B, R) nested lists, 0.0 at holes and padding."""
    out = [[0.0] * R for _ in rows]
    for b, pos in enumerate(policy_positions(policy)):
        for k, t in enumerate(pos):
            out[b][t] = rows[b][k]
    return out


def picked(t: torch.Tensor, policy: torch.Tensor) -> list[list[float]]:
    """Each row's values at its policy tokens, as Python floats."""
    return [[float(t[b, p]) for p in pos] for b, pos in enumerate(policy_positions(policy))]


def assert_full(actual: torch.Tensor, expected: list[list[float]], tol: float = 1e-9) -> None:
    assert actual.shape == (len(expected), R)
    for b in range(len(expected)):
        assert actual[b].tolist() == pytest.approx(expected[b], abs=tol), b


def whiten_rows(rows: list[list[float]]) -> list[list[float]]:
    flat = [x for r in rows for x in r]
    mean = sum(flat) / len(flat)
    var = sum((x - mean) ** 2 for x in flat) / (len(flat) - 1)
    return [[(x - mean) / math.sqrt(var + 1e-8) for x in r] for r in rows]


# ---------------------------------------------------------------- the trajectory module


def test_policy_mask_falls_back_to_the_response_mask():
    extent, policy = masks()
    assert trajectory.policy_mask(Batch(tensors={"response_mask": extent})) is extent
    assert trajectory.policy_mask(Batch(tensors={"response_mask": extent, "policy_mask": policy})) is policy
    with pytest.raises(KeyError, match="response_mask"):
        trajectory.policy_mask(Batch(tensors={"responses": extent}))
    outside = policy.clone()
    outside[4, 3] = 1.0  # past row 4's one token
    for bad in (outside, policy[:, :-1]):
        with pytest.raises(ValueError, match="policy_mask .* must lie within response_mask"):
            trajectory.policy_mask(Batch(tensors={"response_mask": extent, "policy_mask": bad}))


def test_last_policy_token_and_place_on_last_token_against_a_loop():
    _, policy = masks()
    policy[4] = 0.0  # a row without a policy token: position 0
    scores = torch.arange(1.0, len(LENGTHS) + 1)
    last = [max(pos, default=0) for pos in policy_positions(policy)]
    assert trajectory.last_policy_token(policy).tolist() == last
    placed = trajectory.place_on_last_token(scores, policy)
    expected = [[float(scores[b]) if t == last[b] else 0.0 for t in range(R)] for b in range(len(LENGTHS))]
    assert placed.dtype == torch.float32 and placed.tolist() == expected
    assert last[2] == 3 and last[3] == 2  # the hole at the end and the lone policy token


def test_close_and_open_holes_against_a_loop():
    _, policy = masks()
    values = randn(0, policy)
    closed = trajectory.close_holes(values, policy)
    for b, pos in enumerate(policy_positions(policy)):
        assert closed[b].tolist() == [float(values[b, t]) for t in pos] + [0.0] * (R - len(pos))
    assert trajectory.prefix_mask(policy).sum(-1).tolist() == [len(p) for p in policy_positions(policy)]
    reopened = trajectory.open_holes(closed, policy)
    assert torch.equal(reopened, torch.where(policy > 0, values, torch.zeros_like(values)))


# ---------------------------------------------------------------- GAE and returns over the policy's tokens


def gae_loop(rewards, values, policy, gamma, lams) -> tuple[list[list[float]], list[list[float]]]:
    """Per-row GAE over the policy tokens only (holes absent), the value after the last one 0."""
    advs, rets = [], []
    for b, (r, v) in enumerate(zip(picked(rewards, policy), picked(values, policy))):
        n, running, adv = len(r), 0.0, [0.0] * len(r)
        for k in reversed(range(n)):
            running = r[k] + gamma * (v[k + 1] if k + 1 < n else 0.0) - v[k] + gamma * lams[b] * running
            adv[k] = running
        advs.append(adv)
        rets.append([a + x for a, x in zip(adv, v)])
    return advs, rets


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.8), (0.99, 0.0)])
def test_gae_runs_over_the_policy_tokens_as_if_the_holes_were_not_there(gamma, lam):
    _, policy = masks()
    rewards, values = randn(1, policy), randn(2, policy)
    adv, ret = gae(rewards, values, policy, gamma, lam)
    expected_adv, expected_ret = gae_loop(rewards, values, policy, gamma, [lam] * len(LENGTHS))
    assert_full(adv, on_policy(expected_adv, policy))
    assert_full(ret, on_policy(expected_ret, policy))
    whitened, returns = gae_advantages(rewards, values, policy, gamma, lam)
    assert_full(whitened, on_policy(whiten_rows(expected_adv), policy), tol=1e-7)
    assert torch.equal(returns, ret)


def test_gae_bootstraps_across_a_hole_by_hand():
    """Policy tokens at 0 and 2 (a hole at 1 with a huge value): delta_0 = r_0 + gamma V_2 - V_0."""
    policy = torch.tensor([[1.0, 0.0, 1.0]])
    rewards = torch.tensor([[0.0, 100.0, 1.0]])
    values = torch.tensor([[0.5, 100.0, 0.25]])
    adv, ret = gae(rewards, values, policy, 0.5, 1.0)
    # delta_2 = 1 - .25 = .75; delta_0 = 0 + .5 * .25 - .5 = -.375; A_0 = -.375 + .5 * .75 = 0
    assert adv.tolist() == [[0.0, 0.0, 0.75]] and ret.tolist() == [[0.5, 0.0, 1.0]]


def test_gae_with_a_lambda_per_row_and_vapo_over_policy_token_counts():
    _, policy = masks()
    rewards, values = randn(3, policy), randn(4, policy)
    lams = torch.tensor([0.0, 0.5, 0.9, 1.0, 0.3, 0.7, 0.95], dtype=torch.float64)
    adv, _ = gae(rewards, values, policy, 0.95, lams)
    assert_full(adv, on_policy(gae_loop(rewards, values, policy, 0.95, lams.tolist())[0], policy))
    counts = [len(p) for p in policy_positions(policy)]
    actor_lam = length_adaptive_lambda(torch.tensor(counts), 0.5)
    dec_adv, dec_ret = decoupled_gae(rewards, values, policy, 0.95, 0.9, actor_lam)
    assert_full(dec_ret, on_policy(gae_loop(rewards, values, policy, 0.95, [0.9] * len(counts))[1], policy))
    raw_actor = gae_loop(rewards, values, policy, 0.95, actor_lam.tolist())[0]
    assert_full(dec_adv, on_policy(whiten_rows(raw_actor), policy), tol=1e-6)
    cfg = AlgorithmConfig(name="vapo", gamma=0.95, vapo=VAPOConfig(lam_critic=0.9, lam_alpha=0.5))
    extent, _ = masks()
    batch = Batch(tensors={"token_level_rewards": rewards, "values": values, "response_mask": extent,
                           "policy_mask": policy})
    out = ALGORITHMS["vapo"](cfg).compute_advantages(batch)
    assert torch.equal(out["advantages"], dec_adv) and torch.equal(out["returns"], dec_ret)


def returns_loop(rewards, policy, gamma) -> list[list[float]]:
    out = []
    for r in picked(rewards, policy):
        out.append([sum(gamma ** (j - k) * r[j] for j in range(k, len(r))) for k in range(len(r))])
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_returns_to_go_reinforce_pp_and_remax_over_the_policy_tokens(gamma):
    _, policy = masks()
    rewards = randn(5, policy)
    expected = returns_loop(rewards, policy, gamma)
    assert_full(returns_to_go(rewards, policy, gamma), on_policy(expected, policy))
    adv, ret = reinforce_pp_advantages(rewards, policy, gamma)
    assert_full(ret, on_policy(expected, policy))
    assert_full(adv, on_policy(whiten_rows(expected), policy), tol=1e-7)
    baseline = torch.randn(len(LENGTHS), dtype=torch.float64)
    remax_adv, remax_ret = remax_advantages(rewards, policy, baseline)
    undiscounted = returns_loop(rewards, policy, 1.0)
    assert_full(remax_ret, on_policy(undiscounted, policy))
    assert_full(remax_adv, on_policy([[g - float(baseline[b]) for g in row] for b, row in enumerate(undiscounted)],
                                     policy))


def test_reinforce_pp_baseline_scores_only_the_policy_tokens():
    _, policy = masks()
    rewards = randn(6, policy)
    scores = [sum(r) for r in picked(rewards, policy)]
    centred = []
    for b, uid in enumerate(UIDS):
        group = [scores[j] for j, u in enumerate(UIDS) if u == uid]
        centred.append(scores[b] - sum(group) / len(group) if len(group) > 1 else 0.0)
    counts = [len(p) for p in policy_positions(policy)]
    expected = [[c] * n for c, n in zip(centred, counts)]
    adv, ret = reinforce_pp_baseline_advantages(rewards, policy, UIDS)
    assert_full(ret, on_policy(expected, policy), tol=1e-6)
    assert_full(adv, on_policy(whiten_rows(expected), policy), tol=1e-6)


def test_kl_in_reward_penalises_the_policy_tokens_only():
    _, policy = masks()
    rewards = randn(7, policy, garbage=3.0)
    logp, ref = randn(8, policy, garbage=-math.inf), randn(9, policy, garbage=0.0)
    new, mean_kl = kl_in_reward(rewards, logp, ref, policy, 0.1, "k3")
    expected = [[float(rewards[b, t]) for t in range(R)] for b in range(len(LENGTHS))]
    per_seq = []
    for b, pos in enumerate(policy_positions(policy)):
        kls = []
        for t in pos:
            d = float(ref[b, t] - logp[b, t])
            kls.append(math.exp(d) - d - 1)
            expected[b][t] -= 0.1 * kls[-1]
        per_seq.append(sum(kls) / len(kls))
    assert_full(new, expected)
    assert mean_kl == pytest.approx(sum(per_seq) / len(per_seq))


def test_outcome_and_sppo_advantages_are_broadcast_over_policy_tokens_only():
    extent, policy = masks(dtype=torch.float32)
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.2, 0.7])
    rewards = trajectory.place_on_last_token(scores, policy)
    batch = Batch(tensors={"token_level_rewards": rewards, "response_mask": extent, "policy_mask": policy},
                  objects={"uid": UIDS})
    per_sample = {"grpo": grpo_advantages(scores, UIDS), "rloo": rloo_advantages(scores, UIDS),
                  "dr_grpo": grpo_advantages(scores, UIDS, norm_by_std=False),
                  "sppo": group_win_rates(scores, UIDS) - 0.5}
    for name, values in per_sample.items():
        adv = ALGORITHMS[name](AlgorithmConfig(name=name)).compute_advantages(batch)["advantages"]
        expected = [[float(values[b]) if policy[b, t] > 0 else 0.0 for t in range(R)] for b in range(len(UIDS))]
        assert adv.tolist() == expected, name
        assert any(float(v) != 0 for v in values), name


# ---------------------------------------------------------------- losses over the policy's tokens


def loss_inputs(seed: int, per_token_adv: bool = True) -> dict:
    """float64 (B, R) tensors with finite garbage at holes and padding (which a loss multiplies by 0)."""
    _, policy = masks()
    old = -torch.rand(policy.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    logp = old + 0.5 * randn(seed + 1, policy, garbage=None)
    adv = randn(seed + 2, policy, garbage=None)
    if not per_token_adv:
        adv = adv[:, :1].expand_as(adv).clone()
    garbage = policy == 0
    for t in (old, logp, adv):
        t[garbage] = 5.0 + torch.rand(policy.shape, dtype=torch.float64)[garbage]
    return {"logp": logp, "old": old, "adv": adv, "mask": policy}


def aggregate_loop(rows: list[list[float]], mode: str, denominator=None, horizon=None) -> float:
    if mode == "token-mean":
        return sum(map(sum, rows)) / (denominator or sum(map(len, rows)))
    if mode == "seq-mean-token-sum":
        per_seq = [sum(r) for r in rows]
    elif mode == "seq-mean-token-mean":
        per_seq = [sum(r) / len(r) if r else 0.0 for r in rows]
    else:
        per_seq = [sum(r) / (horizon or R) for r in rows]
    return sum(per_seq) / (denominator or len(rows))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("c", [None, 2.0])
def test_aggregate_and_ppo_clip_count_policy_tokens_only(mode, c):
    b = loss_inputs(10)
    values = randn(13, b["mask"], garbage=7.0)
    assert float(aggregate(values, b["mask"], mode)) == pytest.approx(aggregate_loop(picked(values, b["mask"]), mode))
    loss, metrics = ppo_clip_loss(b["logp"], b["old"], b["adv"], b["mask"], clip_low=0.2, clip_high=0.28,
                                  agg_mode=mode, clip_ratio_c=c)
    rows, clipped = [], 0
    for lp, o, a in zip(picked(b["logp"], b["mask"]), picked(b["old"], b["mask"]), picked(b["adv"], b["mask"])):
        row = []
        for x, y, adv in zip(lp, o, a):
            ratio = math.exp(x - y)
            term = max(-adv * ratio, -adv * min(max(ratio, 0.8), 1.28))
            clipped += -adv * min(max(ratio, 0.8), 1.28) > -adv * ratio
            row.append(min(term, -adv * c) if c is not None and adv < 0 else term)
        rows.append(row)
    tokens = sum(map(len, rows))
    assert float(loss) == pytest.approx(aggregate_loop(rows, mode), rel=1e-12)
    assert metrics["pg_clipfrac"] == pytest.approx(clipped / tokens)
    old_minus_new = [y - x for lp, o in zip(picked(b["logp"], b["mask"]), picked(b["old"], b["mask"]))
                     for x, y in zip(lp, o)]
    assert metrics["ppo_kl"] == pytest.approx(sum(old_minus_new) / tokens)


@pytest.mark.parametrize("mode", MODES)
def test_gspo_takes_its_sequence_ratio_over_policy_tokens(mode):
    b = loss_inputs(20, per_token_adv=False)
    loss, _ = gspo_loss(b["logp"], b["old"], b["adv"], b["mask"], clip_low=0.01, clip_high=0.02, agg_mode=mode)
    rows = []
    for lp, o, a in zip(picked(b["logp"], b["mask"]), picked(b["old"], b["mask"]), picked(b["adv"], b["mask"])):
        s = math.exp(sum(x - y for x, y in zip(lp, o)) / len(lp))
        rows.append([max(-adv * s, -adv * min(max(s, 0.99), 1.02)) for adv in a])
    assert float(loss) == pytest.approx(aggregate_loop(rows, mode), rel=1e-12)


def test_sppo_and_its_table_entry_sum_log_ratios_over_policy_tokens():
    b = loss_inputs(30)
    rates = torch.tensor([0.0, 0.25, 1.0, 0.5, 0.75, 0.5, 1.0], dtype=torch.float64)
    loss, metrics = sppo_loss(b["logp"], b["old"], rates, b["mask"], eta=2.0)
    log_ratios = [sum(x - y for x, y in zip(lp, o)) for lp, o in zip(picked(b["logp"], b["mask"]),
                                                                     picked(b["old"], b["mask"]))]
    per_seq = [(lr - 2.0 * (float(p) - 0.5)) ** 2 for lr, p in zip(log_ratios, rates)]
    assert float(loss) == pytest.approx(sum(per_seq) / len(per_seq), rel=1e-12)
    counts = [len(p) for p in policy_positions(b["mask"])]
    assert metrics["sppo_log_ratio"] == pytest.approx(sum(lr * n for lr, n in zip(log_ratios, counts)) / sum(counts))
    entry, _ = LOSSES["sppo"](b["logp"], b["old"], b["adv"], b["mask"],
                              cfg=ActorConfig(loss=LossConfig(sppo=SPPOConfig(eta=2.0))),
                              win_rates=rates)  # the advantages are not read
    assert float(entry) == pytest.approx(float(loss), rel=1e-12)


def test_positive_lm_and_value_losses_count_policy_tokens_only():
    b = loss_inputs(40)
    positive = torch.tensor([True, False, True, True, False, False, True])
    loss, _ = positive_lm_loss(b["logp"], b["mask"], positive)
    nll = [-x for i, lp in enumerate(picked(b["logp"], b["mask"])) if positive[i] for x in lp]
    assert float(loss) == pytest.approx(sum(nll) / len(nll), rel=1e-12)
    values, old, returns = b["logp"], b["old"], b["adv"]
    loss, metrics = value_loss(values, old, returns, b["mask"], clip_range=0.2, agg_mode="seq-mean-token-mean")
    rows = []
    for v, o, g in zip(picked(values, b["mask"]), picked(old, b["mask"]), picked(returns, b["mask"])):
        rows.append([0.5 * max((x - r) ** 2, (y + min(max(x - y, -0.2), 0.2) - r) ** 2) for x, y, r in zip(v, o, g)])
    assert float(loss) == pytest.approx(aggregate_loop(rows, "seq-mean-token-mean"), rel=1e-12)
    flat = [x for row in picked(values, b["mask"]) for x in row]
    assert metrics["vpred_mean"] == pytest.approx(sum(flat) / len(flat))


def test_a_loss_with_holes_equals_the_loss_of_the_responses_with_the_holes_cut_out():
    """The holes' terms are dropped, not zeroed: cutting the hole tokens out of each row (by a loop) gives the
    same loss and gradient, in every aggregation mode (seq-mean-token-mean divides by policy-token counts)."""
    b = loss_inputs(50)
    cut = {}
    for key in ("logp", "old", "adv"):
        rows = picked(b[key], b["mask"])
        cut[key] = torch.tensor([r + [9.0] * (R - len(r)) for r in rows], dtype=torch.float64)
    cut["mask"] = torch.tensor([[1.0] * len(r) + [0.0] * (R - len(r)) for r in picked(b["adv"], b["mask"])],
                               dtype=torch.float64)
    for mode in MODES:
        grads = []
        for inputs in (b, cut):
            logp = inputs["logp"].clone().requires_grad_()
            loss, _ = LOSSES["ppo_clip"](logp, inputs["old"], inputs["adv"], inputs["mask"],
                                         cfg=ActorConfig(loss_agg_mode=mode, loss_horizon=R))
            loss.backward()
            grads.append((float(loss.detach()), picked(logp.grad, inputs["mask"])))
        assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-12), mode
        assert grads[0][1] == grads[1][1], mode
        assert b["mask"].sum() < b["mask"].shape[0] * R  # there are holes to cut


# ---------------------------------------------------------------- metrics


def test_step_and_value_metrics_read_policy_tokens_and_report_both_lengths():
    extent, policy = masks(dtype=torch.float32)
    adv = randn(60, policy, garbage=1e6, dtype=torch.float32)
    batch = Batch(tensors={
        "response_mask": extent, "policy_mask": policy, "advantages": adv,
        "token_level_rewards": trajectory.place_on_last_token(torch.ones(len(LENGTHS)), policy),
        "entropy": randn(61, policy, garbage=1e6, dtype=torch.float32).abs(),
        "rollout_log_probs": randn(62, policy, garbage=1e6, dtype=torch.float32),
        "old_log_probs": randn(63, policy, garbage=-1e6, dtype=torch.float32),
        "values": randn(64, policy, garbage=1e6, dtype=torch.float32),
        "returns": randn(65, policy, garbage=float("nan"), dtype=torch.float32),
    })
    metrics = step_metrics(batch)
    flat = [x for row in picked(adv, policy) for x in row]
    assert metrics["critic/advantages/max"] == pytest.approx(max(flat))
    assert metrics["critic/advantages/mean"] == pytest.approx(sum(flat) / len(flat), abs=1e-6)
    assert metrics["response_length/mean"] == pytest.approx(sum(LENGTHS) / len(LENGTHS))
    counts = [len(p) for p in policy_positions(policy)]
    assert metrics["response_length/policy_tokens"] == pytest.approx(sum(counts) / len(counts))
    entropy = [x for row in picked(batch["entropy"], policy) for x in row]
    assert metrics["actor/entropy"] == pytest.approx(sum(entropy) / len(entropy))
    diffs = [abs(x - y) for a, c in zip(picked(batch["rollout_log_probs"], policy), picked(batch["old_log_probs"],
                                                                                       policy)) for x, y in zip(a, c)]
    assert metrics["rollout/logprob_diff_max"] == pytest.approx(max(diffs))
    values = value_metrics(batch)
    flat_v = [x for row in picked(batch["values"], policy) for x in row]
    assert values["critic/values/mean"] == pytest.approx(sum(flat_v) / len(flat_v), abs=1e-6)
    assert math.isfinite(values["critic/returns/mean"])
    assert non_finite(batch, ("returns",)) == []
    batch.tensors["returns"][0, 0] = float("nan")  # a policy token
    assert non_finite(batch, ("returns",)) == ["returns"]


# ---------------------------------------------------------------- no holes: bit-identical to the code before holes
# The functions as they were before policy_mask existed, verbatim.


def old_gae_advantages(token_rewards, values, response_mask, gamma, lam):
    mask = response_mask.to(values.dtype)
    rewards = token_rewards * mask
    values = values * mask
    length = values.shape[-1]
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = (delta + gamma * lam * next_adv) * mask[:, t]
        next_value = values[:, t]
        advantages[:, t] = next_adv
    returns = (advantages + values) * mask
    return masked_whiten(advantages, mask), returns


def old_gae_per_row_lambda(token_rewards, values, response_mask, gamma, lam):
    mask = response_mask.to(values.dtype)
    rewards = torch.where(mask > 0, token_rewards, torch.zeros_like(token_rewards)).to(values.dtype)
    values = torch.where(mask > 0, values, torch.zeros_like(values))
    lam = lam.to(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[-1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = (delta + gamma * lam * next_adv) * mask[:, t]
        next_value = values[:, t]
        advantages[:, t] = next_adv
    return advantages


def old_decoupled_gae(token_rewards, values, response_mask, gamma, lam_critic, lam_actor):
    mask = response_mask.to(values.dtype)
    critic_lam = torch.full(values.shape[:1], lam_critic, dtype=values.dtype, device=values.device)
    critic_adv = old_gae_per_row_lambda(token_rewards, values, mask, gamma, critic_lam)
    returns = torch.where(mask > 0, critic_adv + values, torch.zeros_like(values))
    actor_adv = old_gae_per_row_lambda(token_rewards, values, mask, gamma, lam_actor)
    return masked_whiten(actor_adv, mask), returns


def old_returns_to_go(token_rewards, response_mask, gamma):
    mask = response_mask.to(token_rewards.dtype)
    rewards = torch.where(mask > 0, token_rewards, torch.zeros_like(token_rewards))
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[-1])):
        running = (rewards[:, t] + gamma * running) * mask[:, t]
        returns[:, t] = running
    return returns


def old_kl_in_reward(token_rewards, log_probs, ref_log_probs, response_mask, coef, estimator):
    valid = response_mask > 0
    kl = torch.where(valid, kl_penalty(log_probs, ref_log_probs, estimator), torch.zeros_like(log_probs))
    new_rewards = token_rewards - coef * kl.to(token_rewards.dtype)
    per_seq = kl.sum(-1) / valid.sum(-1).clamp(min=1)
    return new_rewards, float(per_seq.mean())


def old_place_on_last_token(scores, response_mask):
    last = (response_mask.sum(-1).long() - 1).clamp(min=0)
    out = torch.zeros_like(response_mask)
    out[torch.arange(len(scores)), last] = scores
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("gamma", "lam"), [(0.99, 0.95), (1.0, 1.0), (0.9, 0.37)])
def test_without_holes_every_estimator_is_bit_identical_to_the_old_code(dtype, gamma, lam):
    extent, _ = masks(holes=[[]] * len(LENGTHS), dtype=dtype)
    rewards, values = randn(70, extent, garbage=11.0, dtype=dtype), randn(71, extent, garbage=-13.0, dtype=dtype)
    logp, ref = randn(72, extent, garbage=-3.0, dtype=dtype), randn(73, extent, garbage=2.0, dtype=dtype)
    lams = torch.rand(len(LENGTHS), generator=torch.Generator().manual_seed(74), dtype=dtype)

    def same(new, old):
        new, old = (new, old) if isinstance(new, tuple) else ((new,), (old,))
        assert all(torch.equal(a, b) for a, b in zip(new, old, strict=True))

    same(gae_advantages(rewards, values, extent, gamma, lam), old_gae_advantages(rewards, values, extent, gamma, lam))
    same(gae(rewards, values, extent, gamma, lams)[0], old_gae_per_row_lambda(rewards, values, extent, gamma, lams))
    same(decoupled_gae(rewards, values, extent, gamma, lam, lams),
         old_decoupled_gae(rewards, values, extent, gamma, lam, lams))
    old_rtg = old_returns_to_go(rewards, extent, gamma)
    same(returns_to_go(rewards, extent, gamma), old_rtg)
    same(reinforce_pp_advantages(rewards, extent, gamma), (masked_whiten(old_rtg, extent), old_rtg))
    baseline = torch.randn(len(LENGTHS), dtype=dtype)
    old_undiscounted = old_returns_to_go(rewards, extent, 1.0)
    same(remax_advantages(rewards, extent, baseline),
         ((old_undiscounted - baseline.unsqueeze(-1)) * extent, old_undiscounted))
    for estimator in ("k1", "k3", "low_var_kl"):
        new, new_kl = kl_in_reward(rewards, logp, ref, extent, 0.05, estimator)
        old, old_kl = old_kl_in_reward(rewards, logp, ref, extent, 0.05, estimator)
        assert torch.equal(new, old) and new_kl == old_kl
    scores = torch.randn(len(LENGTHS), dtype=dtype)
    same(trajectory.place_on_last_token(scores.float(), extent.float()), old_place_on_last_token(scores.float(),
                                                                                                 extent.float()))


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_without_holes_an_algorithm_gives_the_same_bits_with_or_without_a_policy_mask(name):
    """policy_mask absent, or equal to response_mask: the same advantages and returns, bit for bit."""
    extent, _ = masks(holes=[[]] * len(LENGTHS), dtype=torch.float32)
    rewards = old_place_on_last_token(torch.randn(len(LENGTHS)), extent) + 0.01 * randn(80, extent, garbage=0.0,
                                                                                           dtype=torch.float32)
    tensors = {"token_level_rewards": rewards, "response_mask": extent,
               "values": randn(81, extent, garbage=5.0, dtype=torch.float32),
               "baseline_scores": torch.randn(len(LENGTHS)),
               "correct": (torch.arange(len(LENGTHS)) % 3 == 0).float(),  # what grpo_pass_k reads
               "rollout_log_probs": -torch.rand(extent.shape, generator=torch.Generator().manual_seed(82))}  # otb
    cfg = AlgorithmConfig(name=name, gamma=0.99, lam=0.95, vapo=VAPOConfig(lam_critic=0.97, lam_alpha=0.5),
                          grpo_pass_k=PassAtKConfig(k=2))
    algo = ALGORITHMS[name](cfg)
    without = algo.compute_advantages(Batch(tensors=dict(tensors), objects={"uid": UIDS}))
    with_mask = algo.compute_advantages(Batch(tensors={**tensors, "policy_mask": extent.clone()},
                                              objects={"uid": UIDS}))
    assert without.keys() == with_mask.keys()
    assert all(torch.equal(without[k], with_mask[k]) for k in without.keys())
    if name == "ppo":
        old_adv, old_ret = old_gae_advantages(rewards, tensors["values"], extent, 0.99, 0.95)
        assert torch.equal(without["advantages"], old_adv) and torch.equal(without["returns"], old_ret)
