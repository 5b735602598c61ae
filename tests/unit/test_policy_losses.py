"""The newer policy losses (CISPO, SAPO, GMPO, GPG, Clip-Cov, KL-Cov, DPPO) against plain loops written token by
token: values and gradients with respect to the log-probs, on a ragged batch with a hole and a padding row; and
their edge cases through the loss table."""

import math

import pytest
import torch

from mmrl.algos.losses import LOSSES
from mmrl.algos.losses.cispo import cispo_loss
from mmrl.algos.losses.clip_cov import ClipCovConfig, clip_cov_loss
from mmrl.algos.losses.dppo import divergence, dppo_loss
from mmrl.algos.losses.gmpo import gmpo_loss
from mmrl.algos.losses.gpg import gpg_loss
from mmrl.algos.losses.kl_cov import kl_cov_loss
from mmrl.algos.losses.sapo import sapo_loss
from mmrl.config import ActorConfig, LossConfig


def ragged_batch(seed=0):
    """logp (a leaf), old_logp, advantages (constant per row, one row 0), mask: lengths 6, 3, 1, 0 (padding), 5
    with a hole (a tool's tokens)."""
    gen = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(5, 6, generator=gen) * 2 - 0.05).requires_grad_()
    old = logp.detach() + torch.randn(5, 6, generator=gen) * 0.4
    old = old.clamp(max=-1e-3)
    advantages = torch.tensor([1.3, -0.7, 0.0, 0.9, -1.6]).unsqueeze(-1).expand(5, 6).clone()
    mask = torch.zeros(5, 6)
    for row, length in enumerate([6, 3, 1, 0, 5]):
        mask[row, :length] = 1
    mask[4, 2] = 0
    return logp, old, advantages, mask


def tokens(mask):
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]


def token_mean(terms, mask):
    """The loop's token-mean: sum of the terms of valid tokens / their count."""
    return sum(terms[k] for k in tokens(mask)) / len(tokens(mask))


def check(loss_fn, reference, **settings):
    """The loss (token-mean) and its gradient equal the reference's."""
    logp, old, adv, mask = ragged_batch()
    loss, metrics = loss_fn(logp, old, adv, mask, **settings)
    (grad,) = torch.autograd.grad(loss, logp)
    ref_logp = logp.detach().clone().requires_grad_()
    expected = reference(ref_logp, old, adv, mask)
    (ref_grad,) = torch.autograd.grad(expected, ref_logp)
    assert float(loss) == pytest.approx(float(expected), rel=1e-5, abs=1e-7)
    assert torch.allclose(grad, ref_grad, atol=1e-6), (grad, ref_grad)
    assert torch.all(grad[mask == 0] == 0)  # padding and holes get no gradient
    assert metrics["ppo_kl"] == pytest.approx(float(((old - logp.detach()) * mask).sum() / mask.sum()), abs=1e-6)
    return metrics


def ratio(logp, old, i, t):
    return torch.exp(logp[i, t] - old[i, t])


def test_cispo():
    def reference(logp, old, adv, mask):
        terms = {(i, t): -min(max(float(ratio(logp, old, i, t)), 1 - 0.2), 1 + 0.3) * adv[i, t] * logp[i, t]
                 for i, t in tokens(mask)}
        return token_mean(terms, mask)

    metrics = check(cispo_loss, reference, clip_low=0.2, clip_high=0.3)
    assert 0 < metrics["pg_clipfrac"] < 1


def test_sapo():
    def reference(logp, old, adv, mask):
        terms = {}
        for i, t in tokens(mask):
            tau = 1.0 if adv[i, t] > 0 else 1.05
            terms[i, t] = -(4 / tau) * torch.sigmoid(tau * (ratio(logp, old, i, t) - 1)) * adv[i, t]
        return token_mean(terms, mask)

    check(sapo_loss, reference, tau_pos=1.0, tau_neg=1.05)


def test_gmpo():
    def reference(logp, old, adv, mask):
        total = 0
        for i in range(mask.shape[0]):
            valid = [t for t in range(mask.shape[1]) if mask[i, t]]
            if not valid:
                continue
            logs = []
            for t in valid:
                x = logp[i, t] - old[i, t]
                clipped = x.clamp(-0.3, 0.25)
                if adv[i, t] > 0:
                    logs.append(torch.minimum(x, clipped))
                elif adv[i, t] < 0:
                    logs.append(torch.maximum(x, clipped))
                else:
                    logs.append(x * 0)
            mean_adv = sum(float(adv[i, t]) for t in valid) / len(valid)
            total = total - mean_adv * torch.exp(sum(logs) / len(valid))
        return total / mask.shape[0]

    metrics = check(gmpo_loss, reference, clip_low=0.3, clip_high=0.25)
    assert 0 < metrics["pg_clipfrac"] < 1


def test_gpg():
    check(gpg_loss, lambda logp, old, adv, mask: token_mean(
        {(i, t): -adv[i, t] * logp[i, t] for i, t in tokens(mask)}, mask))


def covariances(logp, adv, mask):
    valid = tokens(mask)
    mean_logp = sum(float(logp[k]) for k in valid) / len(valid)
    mean_adv = sum(float(adv[k]) for k in valid) / len(valid)
    return {k: (float(logp[k]) - mean_logp) * (float(adv[k]) - mean_adv) for k in valid}


def highest(cov, keys, share):
    """Of max(1, floor(share * all valid tokens)) (the paper's and verl's count), the keys with the highest
    covariance."""
    return set(sorted(keys, key=lambda k: -cov[k])[: max(1, int(share * len(cov)))])


@pytest.mark.parametrize(("lower", "upper"), [(0.0, 100.0), (0.05, 0.4)])
def test_clip_cov(lower, upper):
    def reference(logp, old, adv, mask):
        cov = covariances(logp, adv, mask)
        chosen = highest(cov, [k for k in cov if lower <= cov[k] <= upper], 0.3)
        terms = {k: -adv[k] * (ratio(logp, old, *k).detach() if k in chosen else ratio(logp, old, *k))
                 for k in tokens(mask)}
        reference.chosen = len(chosen)
        return token_mean(terms, mask)

    metrics = check(clip_cov_loss, reference, ratio=0.3, lower=lower, upper=upper)
    assert reference.chosen > 0 and metrics["pg_clipfrac"] == pytest.approx(reference.chosen / 14)


@pytest.mark.parametrize(("share", "count"), [(0.2, 2), (0.01, 1), (0.9, 12)])
def test_kl_cov(share, count):
    """Of the 14 valid tokens, floor(share * 14) (at least one) with the highest covariance, negative ones too
    when the share reaches past the positive ones (0.9)."""
    def reference(logp, old, adv, mask):
        cov = covariances(logp, adv, mask)
        chosen = highest(cov, list(cov), share)
        terms = {k: -adv[k] * ratio(logp, old, *k) + (1.5 * (logp[k] - old[k]).abs() if k in chosen else 0)
                 for k in tokens(mask)}
        reference.negative = sum(cov[k] < 0 for k in chosen)
        return token_mean(terms, mask)

    metrics = check(kl_cov_loss, reference, ratio=share, coef=1.5)
    assert metrics["kl_cov_frac"] == pytest.approx(count / 14)
    assert (reference.negative > 0) == (share == 0.9)


@pytest.mark.parametrize(("kind", "delta"), [("tv", 0.05), ("binary_kl", 0.01)])
def test_dppo(kind, delta):
    def reference(logp, old, adv, mask):
        terms = {}
        for i, t in tokens(mask):
            p, q = math.exp(float(logp[i, t])), math.exp(float(old[i, t]))
            if kind == "tv":
                moved = abs(p - q)
            else:
                moved = q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))
            outward = (adv[i, t] > 0 and p > q) or (adv[i, t] < 0 and p < q)
            r = ratio(logp, old, i, t)
            terms[i, t] = -adv[i, t] * (r.detach() if moved > delta and outward else r)
        return token_mean(terms, mask)

    metrics = check(dppo_loss, reference, kind=kind, delta=delta)
    assert 0 < metrics["pg_clipfrac"] < 1


def test_the_divergences_by_hand():
    p, q = torch.tensor([[0.5, 0.9]]).log(), torch.tensor([[0.25, 0.9]]).log()
    assert torch.allclose(divergence(p, q, "tv"), torch.tensor([[0.25, 0.0]]), atol=1e-6)
    by_hand = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert torch.allclose(divergence(p, q, "binary_kl"), torch.tensor([[by_hand, 0.0]]), atol=1e-6)
    with pytest.raises(ValueError, match="unknown divergence"):
        divergence(p, q, "js")


NEW = ["cispo", "sapo", "gmpo", "gpg", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl"]


@pytest.mark.parametrize("name", NEW)
def test_edge_cases_padding_only_zero_advantages_and_on_policy(name):
    """A batch of only padding rows and zero advantages give a zero loss with zero gradients; on-policy (old =
    logp) every token-level loss's gradient is the plain policy gradient's (GMPO's, per sequence, is checked
    against its loop above)."""
    agg = "seq-mean-token-mean" if name == "gmpo" else "token-mean"
    cfg = ActorConfig(loss_agg_mode=agg, loss=LossConfig(clip_cov=ClipCovConfig(lb=0.0, ub=100.0)))
    entry = LOSSES[name]
    logp, old, adv, mask = ragged_batch(seed=1)
    for adv_, mask_ in ((adv, torch.zeros_like(mask)), (torch.zeros_like(adv), mask)):
        if name == "kl_cov" and mask_.any():
            continue  # it penalises at least one token's |log-ratio|, whatever the advantages
        loss, _ = entry(logp, old, adv_, mask_, cfg=cfg, denominator=5.0)
        (grad,) = torch.autograd.grad(loss, logp)
        assert float(loss) == 0.0 and torch.all(grad == 0), name
    if name in ("gmpo", "clip_cov", "kl_cov"):
        return  # a per-sequence term; token choices that detach or penalise, by design
    loss, _ = entry(logp, logp.detach(), adv, mask, cfg=cfg, denominator=float(mask.sum()))
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(grad, -adv * mask / mask.sum(), atol=1e-6), name
