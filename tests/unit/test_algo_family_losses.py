"""The policy-loss family (aggregation modes, clip-higher, dual-clip, GSPO, SPPO, VAPO's LM loss, KL
estimators) against loop references written on Python floats, one sample and one token at a time."""

import math

import pytest
import torch

from mmrl.algos.aggregation import aggregate
from mmrl.algos.kl import kl_penalty
from mmrl.algos.losses import LOSSES
from mmrl.algos.losses.gspo import gspo_loss
from mmrl.algos.losses.positive_lm import positive_lm_loss
from mmrl.algos.losses.ppo_clip import ppo_clip_loss
from mmrl.algos.losses.sppo import SPPOConfig, sppo_loss
from mmrl.config import ActorConfig, LossConfig

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LENGTHS = [6, 3, 1, 4]  # unequal, right-padded, one single-token response
WIDTH = 7  # wider than the longest response: every row has padding


def make_batch(seed: int = 0, spread: float = 0.4, per_token_adv: bool = True) -> dict:
    """float64 (B, R) tensors; padding holds garbage so that a missed mask shows."""
    g = torch.Generator().manual_seed(seed)
    shape = (len(LENGTHS), WIDTH)
    mask = torch.tensor([[1.0] * n + [0.0] * (WIDTH - n) for n in LENGTHS], dtype=torch.float64)
    old = -torch.rand(shape, generator=g, dtype=torch.float64) * 3
    logp = old + spread * torch.randn(shape, generator=g, dtype=torch.float64)
    if per_token_adv:
        adv = torch.randn(shape, generator=g, dtype=torch.float64)
    else:
        adv = torch.randn(shape[0], 1, generator=g, dtype=torch.float64).expand(shape).clone()
    pad = mask == 0
    for t in (old, logp, adv):
        t[pad] = 5 + torch.rand(shape, generator=g, dtype=torch.float64)[pad]
    return {"logp": logp, "old": old, "adv": adv, "mask": mask}


def rows(t: torch.Tensor) -> list[list[float]]:
    """Each row's valid entries as Python floats."""
    return [[float(x) for x in t[i, :n]] for i, n in enumerate(LENGTHS)]


def ref_aggregate(vals: list[list[float]], mode: str, denominator=None, horizon=None) -> float:
    if mode == "token-mean":
        count = denominator if denominator is not None else sum(len(r) for r in vals)
        return sum(sum(r) for r in vals) / count
    count = denominator if denominator is not None else len(vals)
    if mode == "seq-mean-token-sum":
        per_seq = [sum(r) for r in vals]
    elif mode == "seq-mean-token-mean":
        per_seq = [sum(r) / len(r) for r in vals]
    else:
        h = horizon if horizon is not None else WIDTH
        per_seq = [sum(r) / h for r in vals]
    return sum(per_seq) / count


def ref_weights(mode: str, denominator=None, horizon=None) -> list[list[float]]:
    """d loss / d value_t of each valid token under the aggregation ``mode``."""
    out = []
    for n in LENGTHS:
        if mode == "token-mean":
            w = 1 / (denominator if denominator is not None else sum(LENGTHS))
        else:
            count = denominator if denominator is not None else len(LENGTHS)
            per = {"seq-mean-token-sum": 1, "seq-mean-token-mean": n,
                   "seq-mean-token-sum-norm": horizon if horizon is not None else WIDTH}[mode]
            w = 1 / (count * per)
        out.append([w] * n)
    return out


def ref_kl_metric(lp, op) -> float:
    """Mean of old - new log-prob over the valid tokens."""
    diffs = [o - l for lrow, orow in zip(lp, op) for l, o in zip(lrow, orow)]
    return sum(diffs) / len(diffs)


def ref_ppo(lp, op, ad, low, high, c=None):
    """Per-token losses and clip flags of (dual-clip) PPO, one token at a time."""
    losses, clipped_flags, capped_flags = [], 0, 0
    for lrow, orow, arow in zip(lp, op, ad):
        row = []
        for l, o, a in zip(lrow, orow, arow):
            r = math.exp(l - o)
            un, cl = -a * r, -a * min(max(r, 1 - low), 1 + high)
            loss = max(un, cl)
            clipped_flags += cl > un
            if c is not None and a < 0 and loss > -a * c:
                loss = -a * c
                capped_flags += 1
            row.append(loss)
        losses.append(row)
    return losses, clipped_flags, capped_flags


# --- aggregation -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("denominator,horizon", [(None, None), (10.0, None), (None, 16), (3.0, 9)])
def test_aggregate_matches_loop_reference(mode, denominator, horizon):
    b = make_batch()
    got = float(aggregate(b["logp"], b["mask"], mode, denominator, horizon))
    assert got == pytest.approx(ref_aggregate(rows(b["logp"]), mode, denominator, horizon), rel=1e-12)


def test_seq_mean_token_sum_norm_by_hand():
    v = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert float(aggregate(v, m, "seq-mean-token-sum-norm")) == pytest.approx((6 + 4) / (2 * 4))
    assert float(aggregate(v, m, "seq-mean-token-sum-norm", horizon=10)) == pytest.approx(10 / 20)
    norm = aggregate(v, m, "seq-mean-token-sum-norm", denominator=5, horizon=10)
    assert float(norm) == pytest.approx(10 / 50)
    # the other modes ignore the horizon
    assert float(aggregate(v, m, "seq-mean-token-sum", horizon=10)) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        aggregate(v, m, "bogus")
    with pytest.raises(ValueError, match="horizon"):
        aggregate(v, m, "seq-mean-token-sum-norm", horizon=0)


def test_seq_mean_token_sum_norm_micro_batches_add_up_with_a_fixed_horizon():
    b = make_batch()
    v, m = b["logp"], b["mask"]
    whole = aggregate(v, m, "seq-mean-token-sum-norm", horizon=16)
    # micro-batches cut to their own widths: a constant horizon and the global count keep the sum exact
    parts = [aggregate(v[:2, :6], m[:2, :6], "seq-mean-token-sum-norm", denominator=4, horizon=16),
             aggregate(v[2:, :4], m[2:, :4], "seq-mean-token-sum-norm", denominator=4, horizon=16)]
    assert float(sum(parts)) == pytest.approx(float(whole), rel=1e-12)


# --- PPO: clip-higher and dual-clip ------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("c", [None, 3.0, 1.5])
def test_ppo_clip_loss_asymmetric_and_dual_clip_match_loop_reference(mode, c):
    b = make_batch(seed=3, spread=1.2)
    lp, op, ad = rows(b["logp"]), rows(b["old"]), rows(b["adv"])
    per_token, n_clipped, n_capped = ref_ppo(lp, op, ad, 0.2, 0.28, c)
    loss, metrics = ppo_clip_loss(b["logp"], b["old"], b["adv"], b["mask"], clip_low=0.2, clip_high=0.28,
                                  agg_mode=mode, denominator=9.0, clip_ratio_c=c, horizon=11)
    n = sum(LENGTHS)
    assert 0 < n_clipped < n  # the batch exercises both branches
    assert loss.item() == pytest.approx(ref_aggregate(per_token, mode, 9.0, 11), rel=1e-10)
    assert metrics["pg_clipfrac"] == pytest.approx(n_clipped / n)
    assert metrics["ppo_kl"] == pytest.approx(ref_kl_metric(lp, op))
    if c is None:
        assert "pg_clipfrac_lower" not in metrics
    else:
        assert n_capped > 0
        assert metrics["pg_clipfrac_lower"] == pytest.approx(n_capped / n)


def test_clip_higher_by_hand():
    # ratio 1.25 with A > 0: clipped by high=0.2, not by high=0.28; ratio 0.75 with A < 0: low=0.2 clips it
    logp = torch.log(torch.tensor([[1.25, 0.75]]))
    adv, mask, old = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), torch.zeros(1, 2)
    sym, m_sym = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    asym, m_asym = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert float(sym) == pytest.approx((-1.2 + 0.8) / 2)
    assert float(asym) == pytest.approx((-1.25 + 0.8) / 2)
    assert (m_sym["pg_clipfrac"], m_asym["pg_clipfrac"]) == (1.0, 0.5)


def test_clip_higher_keeps_the_gradient_of_a_rising_positive_token():
    grads = {}
    for high in (0.2, 0.28):
        logp = torch.log(torch.tensor([[1.25, 0.75]])).requires_grad_()
        loss, _ = ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2),
                                clip_low=0.2, clip_high=high)
        loss.backward()
        grads[high] = logp.grad[0].tolist()
    assert grads[0.2] == pytest.approx([0.0, 0.0])
    assert grads[0.28] == pytest.approx([-1.25 / 2, 0.0])  # d(-A r)/d logp = -A r, over 2 tokens


def test_dual_clip_by_hand_and_zero_gradient_under_the_cap():
    # A = -1; ratios e^1.5 = 4.48 (> c = 3: capped at 3), e^0.5 = 1.65 (unclipped), e^-1 (clipped at .8)
    logp = torch.tensor([[1.5, 0.5, -1.0]], requires_grad=True)
    adv = -torch.ones(1, 3)
    loss, metrics = ppo_clip_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), clip_low=0.2, clip_high=0.2,
                                  clip_ratio_c=3.0)
    assert loss.item() == pytest.approx((3.0 + math.exp(0.5) + 0.8) / 3)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 3)
    assert metrics["pg_clipfrac"] == pytest.approx(1 / 3)  # only the ratio e^-1 token is below 1 - low
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, math.exp(0.5) / 3, 0.0])


def test_dual_clip_gradient_matches_loop_reference():
    b = make_batch(seed=2, spread=1.5)
    logp = b["logp"].clone().requires_grad_()
    loss, _ = ppo_clip_loss(logp, b["old"], b["adv"], b["mask"], clip_low=0.2, clip_high=0.2,
                            agg_mode="seq-mean-token-mean", clip_ratio_c=2.0)
    loss.backward()
    weights = ref_weights("seq-mean-token-mean")
    n_zero_by_cap = 0
    for i, n in enumerate(LENGTHS):
        for t in range(n):
            l, o, a = float(b["logp"][i, t]), float(b["old"][i, t]), float(b["adv"][i, t])
            r = math.exp(l - o)
            takes_ratio = -a * r >= -a * min(max(r, 0.8), 1.2)
            capped = a < 0 and max(-a * r, -a * min(max(r, 0.8), 1.2)) > -2.0 * a
            n_zero_by_cap += capped and takes_ratio
            expected = 0.0 if capped or not takes_ratio else -a * r * weights[i][t]
            assert float(logp.grad[i, t]) == pytest.approx(expected, abs=1e-12), (i, t)
        assert logp.grad[i, n:].abs().max() == 0
    assert n_zero_by_cap > 0  # some token would move under plain PPO but is held by the cap


def test_dual_clip_leaves_positive_advantages_and_small_ratios_alone():
    b = make_batch(seed=3, spread=1.5)
    adv = b["adv"].abs() + 0.1  # all positive: the cap never applies
    plain, _ = ppo_clip_loss(b["logp"], b["old"], adv, b["mask"], clip_low=0.2, clip_high=0.2)
    dual, metrics = ppo_clip_loss(b["logp"], b["old"], adv, b["mask"], clip_low=0.2, clip_high=0.2,
                                  clip_ratio_c=1.01)
    assert float(dual) == float(plain) and metrics["pg_clipfrac_lower"] == 0.0
    # negative advantages with every ratio below c: the cap never binds either
    small = make_batch(seed=3, spread=0.1)
    neg = -adv
    plain, _ = ppo_clip_loss(small["logp"], small["old"], neg, small["mask"], clip_low=0.2, clip_high=0.2)
    dual, metrics = ppo_clip_loss(small["logp"], small["old"], neg, small["mask"], clip_low=0.2,
                                  clip_high=0.2, clip_ratio_c=3.0)
    assert float(dual) == float(plain) and metrics["pg_clipfrac_lower"] == 0.0


@pytest.mark.parametrize("c", [1.0, 0.5, -2.0])
def test_dual_clip_rejects_a_cap_not_above_one(c):
    b = make_batch()
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_clip_loss(b["logp"], b["old"], b["adv"], b["mask"], clip_low=0.2, clip_high=0.2, clip_ratio_c=c)


# --- GSPO --------------------------------------------------------------------------------------------


def ref_gspo(lp, op, ad, low, high):
    """Per-token losses, per-token d loss_t / d logp_t, and the number of clipped tokens."""
    losses, grads, n_clipped = [], [], 0
    for lrow, orow, arow in zip(lp, op, ad):
        s = math.exp(sum(l - o for l, o in zip(lrow, orow)) / len(lrow))
        lrow_loss, lrow_grad = [], []
        for a in arow:
            un, cl = -a * s, -a * min(max(s, 1 - low), 1 + high)
            lrow_loss.append(max(un, cl))
            # GSPO-token: d s_it / d logp_t = s_i, and the clipped branch is constant
            lrow_grad.append(-a * s if un >= cl else 0.0)
            n_clipped += cl > un
        losses.append(lrow_loss)
        grads.append(lrow_grad)
    return losses, grads, n_clipped


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("per_token_adv", [True, False])
def test_gspo_value_gradient_and_metrics_match_loop_reference(mode, per_token_adv):
    b = make_batch(seed=4, spread=0.3, per_token_adv=per_token_adv)
    lp, op, ad = rows(b["logp"]), rows(b["old"]), rows(b["adv"])
    low, high = 0.05, 0.08
    per_token, token_grads, n_clipped = ref_gspo(lp, op, ad, low, high)
    logp = b["logp"].clone().requires_grad_()
    loss, metrics = gspo_loss(logp, b["old"], b["adv"], b["mask"], clip_low=low, clip_high=high,
                              agg_mode=mode, denominator=7.0, horizon=12)
    n = sum(LENGTHS)
    assert 0 < n_clipped < n
    assert loss.item() == pytest.approx(ref_aggregate(per_token, mode, 7.0, 12), rel=1e-10)
    assert metrics["pg_clipfrac"] == pytest.approx(n_clipped / n)
    assert metrics["ppo_kl"] == pytest.approx(ref_kl_metric(lp, op))
    loss.backward()
    weights = ref_weights(mode, 7.0, 12)
    for i, n_i in enumerate(LENGTHS):
        expected = [g * w for g, w in zip(token_grads[i], weights[i])]
        assert logp.grad[i, :n_i].tolist() == pytest.approx(expected, rel=1e-10, abs=1e-14), i
        assert logp.grad[i, n_i:].abs().max() == 0


def test_gspo_clips_whole_sequences_not_tokens():
    # row 0: token ratios e^{+0.5} and e^{-0.5}, geometric mean exactly 1: token-level PPO clips the first
    # token, GSPO neither and weighs both gradients by s = 1; row 1: one token with ratio e^{0.1} > 1 + high
    logp = torch.tensor([[0.5, -0.5], [0.1, 7.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    loss, metrics = gspo_loss(logp, torch.zeros(2, 2), adv, mask, clip_low=3e-4, clip_high=4e-4)
    _, ppo_metrics = ppo_clip_loss(logp, torch.zeros(2, 2), adv, mask, clip_low=3e-4, clip_high=4e-4)
    assert ppo_metrics["pg_clipfrac"] == pytest.approx(2 / 3)
    assert metrics["pg_clipfrac"] == pytest.approx(1 / 3)
    # seq-mean-token-mean: (mean(-1, -1) + -2 * 1.0004) / 2
    assert loss.item() == pytest.approx((-1.0 - 2 * 1.0004) / 2, rel=1e-6)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.25, -0.25, 0.0, 0.0], abs=1e-6)


def test_gspo_one_token_responses_equal_token_level_ppo():
    b = make_batch(seed=5, spread=0.3)
    logp, old, adv, mask = b["logp"][:, :1], b["old"][:, :1], b["adv"][:, :1], b["mask"][:, :1]
    g, g_metrics = gspo_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.1, agg_mode="token-mean")
    p, p_metrics = ppo_clip_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.1)
    assert float(g) == pytest.approx(float(p), rel=1e-12) and g_metrics == pytest.approx(p_metrics)


# --- zero advantages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ppo", "dual", "gspo"])
def test_zero_advantages_give_zero_loss_and_gradient(name):
    b = make_batch(seed=6, spread=1.5)
    logp = b["logp"].clone().requires_grad_()
    zeros = torch.zeros_like(b["adv"])
    if name == "gspo":
        loss, metrics = gspo_loss(logp, b["old"], zeros, b["mask"], clip_low=3e-4, clip_high=4e-4)
    else:
        loss, metrics = ppo_clip_loss(logp, b["old"], zeros, b["mask"], clip_low=0.2, clip_high=0.2,
                                      clip_ratio_c=3.0 if name == "dual" else None)
    loss.backward()
    assert loss.item() == 0.0 and metrics["pg_clipfrac"] == 0.0
    assert logp.grad.abs().max() == 0
    assert metrics.get("pg_clipfrac_lower", 0.0) == 0.0


# --- SPPO --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("denominator", [None, 10.0])
def test_sppo_value_gradient_and_metrics_match_loop_reference(denominator):
    b = make_batch(seed=7, spread=0.3)
    win = torch.tensor([0.9, 0.2, 0.5, 0.65], dtype=torch.float64)
    eta = 2.5
    lp, op = rows(b["logp"]), rows(b["old"])
    count = denominator if denominator is not None else len(LENGTHS)
    log_ratios = [sum(l - o for l, o in zip(lr, orr)) for lr, orr in zip(lp, op)]
    targets = [eta * (float(w) - 0.5) for w in win]
    expected = sum((r - t) ** 2 for r, t in zip(log_ratios, targets)) / count
    logp = b["logp"].clone().requires_grad_()
    loss, metrics = sppo_loss(logp, b["old"], win, b["mask"], eta=eta, denominator=denominator)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    n = sum(LENGTHS)
    assert metrics["sppo_log_ratio"] == pytest.approx(sum(r * k for r, k in zip(log_ratios, LENGTHS)) / n)
    assert metrics["sppo_target"] == pytest.approx(sum(t * k for t, k in zip(targets, LENGTHS)) / n)
    assert metrics["ppo_kl"] == pytest.approx(-sum(log_ratios) / n)
    loss.backward()
    for i, n_i in enumerate(LENGTHS):
        # every valid token of row i gets d/d logp_t (r_i - t_i)^2 / count = 2 (r_i - t_i) / count
        assert logp.grad[i, :n_i].tolist() == pytest.approx([2 * (log_ratios[i] - targets[i]) / count] * n_i)
        assert logp.grad[i, n_i:].abs().max() == 0


def test_sppo_by_hand_and_shape_check():
    logp = torch.tensor([[0.3, 0.2, 9.0], [-0.1, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # log ratios 0.5 and -0.1; targets 1 * (1 - 0.5) = 0.5 and 1 * (0 - 0.5) = -0.5
    loss, _ = sppo_loss(logp, torch.zeros(2, 3), torch.tensor([1.0, 0.0]), mask, eta=1.0)
    assert loss.item() == pytest.approx((0.0 + 0.4**2) / 2)
    with pytest.raises(ValueError, match="win_rates"):
        sppo_loss(logp, torch.zeros(2, 3), torch.tensor([[1.0], [0.0]]), mask, eta=1.0)


# --- VAPO's positive-example LM loss -----------------------------------------------------------------


@pytest.mark.parametrize("denominator", [None, 20.0])
def test_positive_lm_loss_matches_loop_reference(denominator):
    b = make_batch(seed=8)
    positive = torch.tensor([True, False, True, False])
    lp = rows(b["logp"])
    tokens = [x for row, pos in zip(lp, positive.tolist()) if pos for x in row]
    count = denominator if denominator is not None else len(tokens)
    logp = b["logp"].clone().requires_grad_()
    loss, metrics = positive_lm_loss(logp, b["mask"], positive, denominator)
    assert loss.item() == pytest.approx(-sum(tokens) / count, rel=1e-12)
    n = sum(LENGTHS)
    assert metrics["positive_token_frac"] == pytest.approx(len(tokens) / n)
    assert metrics["positive_nll"] == pytest.approx(-sum(tokens) / n)
    loss.backward()
    for i, n_i in enumerate(LENGTHS):
        expected = -1 / count if positive[i] else 0.0
        assert logp.grad[i, :n_i].tolist() == pytest.approx([expected] * n_i)
        assert logp.grad[i, n_i:].abs().max() == 0


def test_positive_lm_loss_single_token_positive():
    logp = torch.tensor([[-2.0, 5.0], [-0.5, -0.7]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    loss, metrics = positive_lm_loss(logp, mask, torch.tensor([True, False]))
    assert loss.item() == pytest.approx(2.0)
    assert metrics == pytest.approx({"positive_token_frac": 1 / 3, "positive_nll": 2 / 3})


def test_positive_lm_loss_without_a_positive_sample_is_a_differentiable_zero():
    b = make_batch(seed=9)
    logp = b["logp"].clone().requires_grad_()
    loss, metrics = positive_lm_loss(logp, b["mask"], torch.zeros(len(LENGTHS), dtype=torch.bool))
    assert loss.item() == 0.0 and loss.grad_fn is not None
    assert metrics == {"positive_token_frac": 0.0, "positive_nll": 0.0}
    loss.backward()
    assert logp.grad.abs().max() == 0
    with pytest.raises(ValueError, match="positive"):
        positive_lm_loss(logp, b["mask"], torch.zeros(len(LENGTHS) + 1, dtype=torch.bool))


# --- KL estimators -----------------------------------------------------------------------------------


def ref_kl(l: float, r: float, estimator: str) -> float:
    d = l - r
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "abs":
        return abs(d)
    neg = -d if estimator == "k3" else min(max(-d, -20.0), 20.0)
    kl = math.exp(neg) - neg - 1
    return kl if estimator == "k3" else min(max(kl, -10.0), 10.0)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "low_var_kl", "abs"])
def test_kl_estimators_match_loop_reference(estimator):
    b = make_batch(seed=10, spread=2.0)
    ref = b["old"].clone()
    ref[0, 0] = b["logp"][0, 0] + 4.0  # exp(4) - 4 - 1 = 49.6: low_var_kl clamps it to 10
    got = kl_penalty(b["logp"], ref, estimator)
    for i in range(len(LENGTHS)):
        for t in range(WIDTH):
            expected = ref_kl(float(b["logp"][i, t]), float(ref[i, t]), estimator)
            assert float(got[i, t]) == pytest.approx(expected, rel=1e-12, abs=1e-12), (i, t)


def test_abs_kl_by_hand_and_error_message():
    logp, ref = torch.tensor([0.0, -1.0, -2.0]), torch.tensor([-1.0, -1.0, -0.5])
    assert kl_penalty(logp, ref, "abs").tolist() == pytest.approx([1.0, 0.0, 1.5])
    with pytest.raises(ValueError, match="abs"):
        kl_penalty(logp, ref, "k9")


# --- the LOSSES table -------------------------------------------------------------------------


def test_dual_clip_and_gspo_table_entries_read_the_actor_config():
    b = make_batch(seed=11, spread=1.5)
    args = (b["logp"], b["old"], b["adv"], b["mask"])
    cfg = ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="seq-mean-token-mean")
    cfg.loss.dual_clip.clip_ratio_c = 2.0
    loss, metrics = LOSSES["dual_clip"](*args, cfg=cfg, denominator=6.0)
    direct = ppo_clip_loss(*args, clip_low=0.2, clip_high=0.28, agg_mode="seq-mean-token-mean",
                           denominator=6.0, clip_ratio_c=2.0)
    assert loss.item() == direct[0].item() and metrics == direct[1] and metrics["pg_clipfrac_lower"] > 0

    default_cfg = ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.28)  # clip_ratio_c defaults to 3
    loss, metrics = LOSSES["dual_clip"](*args, cfg=default_cfg)
    direct = ppo_clip_loss(*args, clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0)
    assert loss.item() == direct[0].item() and metrics == direct[1]

    cfg = ActorConfig(clip_ratio_low=0.01, clip_ratio_high=0.02, loss_agg_mode="seq-mean-token-sum")
    loss, metrics = LOSSES["gspo"](*args, cfg=cfg, denominator=6.0)
    direct = gspo_loss(*args, clip_low=0.01, clip_high=0.02, agg_mode="seq-mean-token-sum", denominator=6.0)
    assert loss.item() == direct[0].item() and metrics == direct[1]


def test_the_sppo_table_entry_reads_the_win_rates_field():
    """The sppo entry calls sppo_loss with the batch's win_rates (B,) and actor.loss.sppo.eta, and never reads the
    advantages; a row without a valid token (a dispatcher's padding copy) adds nothing, whatever its rate."""
    b = make_batch(seed=12, spread=1.0)
    rates = torch.tensor([0.0, 0.25, 1.0, 0.5], dtype=b["logp"].dtype)
    cfg = ActorConfig(loss=LossConfig(sppo=SPPOConfig(eta=2.5)), loss_agg_mode="seq-mean-token-mean")
    garbage = torch.full_like(b["adv"], float("nan"))
    loss, metrics = LOSSES["sppo"](b["logp"], b["old"], garbage, b["mask"], cfg=cfg, denominator=5.0,
                                   win_rates=rates)
    direct = sppo_loss(b["logp"], b["old"], rates, b["mask"], eta=2.5, denominator=5.0)
    assert loss.item() == direct[0].item() and metrics == direct[1]

    padded = {k: torch.cat([v, v[:1]]) for k, v in b.items()}
    padded["mask"][-1] = 0.0
    loss_padded, _ = LOSSES["sppo"](padded["logp"], padded["old"], padded["adv"], padded["mask"], cfg=cfg,
                                    denominator=5.0, win_rates=torch.cat([rates, rates[:1]]))
    assert loss_padded.item() == pytest.approx(loss.item(), rel=1e-12)


def test_the_positive_lm_extra_loss_reads_the_correct_field():
    b = make_batch(seed=13)
    correct = torch.tensor([1.0, 0.0, 1.0, 0.0])
    loss, metrics = LOSSES["positive_lm"](b["logp"], b["mask"], cfg=ActorConfig(), denominator=7.0,
                                          correct=correct)
    direct = positive_lm_loss(b["logp"], b["mask"], correct.bool(), 7.0)
    assert loss.item() == direct[0].item() and metrics == direct[1]
