"""The 2025-26 policy losses: each a pure function ``(logp, old_logp, advantages, mask, ...) -> (loss, metrics)``
with the signature of :mod:`mmrl.algos.losses`' policy losses, and its ``actor.*`` settings.

Every tensor is (B, R); ``mask`` marks the policy's own tokens; ``denominator`` and ``horizon`` as in
:func:`mmrl.algos.aggregation.aggregate`. Every metric is a mean over the valid tokens. ``r_t = exp(logp_t -
old_logp_t)`` is the token ratio; ``sg`` is stop-gradient.

- **CISPO** (MiniMax-M1, 2025): ``-sg(clip(r, 1 - low, 1 + high)) * A * logp``: the importance weight is clipped
  and held constant, so a clipped token still gets a gradient (PPO's clip drops it).
- **SAPO** (Qwen, Soft Adaptive Policy Optimization, 2025): ``-(4 / tau) * sigmoid(tau * (r - 1)) * A`` with
  ``tau = tau_pos`` for positive advantages and ``tau_neg`` for negative ones: a smooth gate in place of the hard
  clip (its gradient is the plain one at ``r = 1`` and fades away from it).
- **GMPO** (Geometric-Mean Policy Optimization, 2025): one term per sequence, ``-mean_A * exp(mean_t l_t)``, the
  geometric mean of the token ratios, each log-ratio ``l_t`` clipped to ``[-low, high]`` in log space on the
  pessimistic side (PPO's min in log space, by the sign of the advantage).
- **GPG** (Group Policy Gradient, 2025): the plain policy gradient ``-A * logp``, no ratio and no clip.
- **Clip-Cov** and **KL-Cov** (Cui et al., The Entropy Mechanism of RL for Reasoning LMs, 2025): the tokens whose
  centred covariance ``(logp_t - mean logp) * (A_t - mean A)`` (over the valid tokens of the batch given: a
  micro-batch in the update) is highest drive the entropy down. Each picks ``max(1, floor(ratio * valid
  tokens))`` tokens, as the paper and verl do: Clip-Cov detaches those with the highest covariance within
  ``[clip_cov_lb, clip_cov_ub]`` (chosen by rank, where the paper draws them at random from that window, so
  fewer when fewer lie in it); KL-Cov adds ``kl_cov_coef * |logp - old_logp|`` to those with the highest
  covariance, whatever its sign. The others take ``-A * r``.
- **DPPO** (a trust region on the probability, not the ratio; prime-rl's default loss): ``-A * r`` whose
  gradient is dropped where the token's probability has moved beyond ``delta`` from the old one *in the
  advantage's direction* (up for A > 0, down for A < 0), the divergence measured as total variation ``|p - q|``
  (``dppo_tv``) or as the binary KL ``q log(q/p) + (1-q) log((1-q)/(1-p))`` (``dppo_kl``), p and q the new and old
  probabilities of the sampled token.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mmrl.algos.aggregation import aggregate
from mmrl.config import ActorConfig


def _mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


def _kl_metric(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    return {"ppo_kl": _mean((old_logp - logp).detach(), mask)}


def cispo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
               clip_low: float, clip_high: float, agg_mode: str = "token-mean", denominator: float | None = None,
               horizon: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: ``-sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * logp``. Metrics: ``pg_clipfrac`` (share of tokens
    whose weight was clipped), ``ppo_kl``."""
    ratio = torch.exp(logp - old_logp).detach()
    weight = ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = aggregate(-weight * advantages * logp, mask, agg_mode, denominator, horizon)
    clipped = ((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float()
    return loss, {"pg_clipfrac": _mean(clipped, mask), **_kl_metric(logp, old_logp, mask)}


def sapo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              tau_pos: float, tau_neg: float, agg_mode: str = "token-mean", denominator: float | None = None,
              horizon: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO: ``-(4 / tau) * sigmoid(tau * (r - 1)) * A``, ``tau`` by the advantage's sign. Metrics: ``sapo_gate``
    (the mean of ``4 sigmoid (1 - sigmoid)``, the factor on each token's plain gradient: 1 on-policy), ``ppo_kl``."""
    ratio = torch.exp(logp - old_logp)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1))
    loss = aggregate(-(4 / tau) * gate * advantages, mask, agg_mode, denominator, horizon)
    factor = (4 * gate * (1 - gate)).detach()
    return loss, {"sapo_gate": _mean(factor, mask), **_kl_metric(logp, old_logp, mask)}


def gmpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              clip_low: float, clip_high: float, denominator: float | None = None
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO: per sequence ``-mean_t(A) * exp(mean_t(l_t))``, ``l_t = sign(A) * min(sign(A) * x, sign(A) *
    clip(x, -clip_low, clip_high))`` with ``x = logp - old_logp``; summed over sequences / (B, or
    ``denominator``: a sequence count). A row without a policy token adds nothing. Metrics: ``pg_clipfrac``
    (share of tokens whose clipped log-ratio was taken), ``ppo_kl``."""
    log_ratio = logp - old_logp
    sign = torch.sign(advantages)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(-clip_low, clip_high))
    lengths = mask.sum(-1)
    present = (lengths > 0).to(logp.dtype)
    safe = lengths.clamp(min=1)
    seq_ratio = torch.exp((pessimistic * mask).sum(-1) / safe)
    seq_adv = (advantages * mask).sum(-1) / safe
    count = denominator if denominator is not None else logp.shape[0]
    loss = (-seq_adv * seq_ratio * present).sum() / count
    taken = (pessimistic != log_ratio).float()
    return loss, {"pg_clipfrac": _mean(taken, mask), **_kl_metric(logp, old_logp, mask)}


def gpg_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
             agg_mode: str = "token-mean", denominator: float | None = None, horizon: float | None = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG: ``-A * logp``. Metrics: ``ppo_kl``."""
    return aggregate(-advantages * logp, mask, agg_mode, denominator, horizon), _kl_metric(logp, old_logp, mask)


def covariance(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, R) -> (B, R): ``(logp - mean logp) * (A - mean A)``, the means over the valid tokens (no gradient)."""
    logp, advantages = logp.detach(), advantages.detach()
    return (logp - _mean(logp, mask)) * (advantages - _mean(advantages, mask))


def top_tokens(scores: torch.Tensor, eligible: torch.Tensor, k: int) -> torch.Tensor:
    """(B, R) bool: the (at most) ``k`` eligible tokens with the highest score."""
    chosen = torch.zeros_like(eligible)
    k = min(k, int(eligible.sum()))
    if k:
        flat = torch.where(eligible, scores, torch.full_like(scores, -math.inf)).flatten()
        chosen.view(-1)[torch.topk(flat, k).indices] = True
    return chosen


def share_of(mask: torch.Tensor, share: float) -> int:
    """``max(1, floor(share * valid tokens))`` (0 without valid tokens): how many tokens a covariance loss picks."""
    valid = int(mask.sum())
    return max(1, math.floor(share * valid)) if valid else 0


def clip_cov_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                  ratio: float, lower: float, upper: float, agg_mode: str = "token-mean",
                  denominator: float | None = None, horizon: float | None = None
                  ) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov: ``-A * r``, detached on ``share_of(mask, ratio)`` tokens (fewer when fewer lie in the window):
    those with the highest covariance within ``[lower, upper]``. Metrics: ``pg_clipfrac`` (the detached share),
    ``ppo_kl``."""
    cov = covariance(logp, advantages, mask)
    valid = mask.bool()
    chosen = top_tokens(cov, valid & (cov >= lower) & (cov <= upper), share_of(mask, ratio))
    token_ratio = torch.exp(logp - old_logp)
    token_ratio = torch.where(chosen, token_ratio.detach(), token_ratio)
    loss = aggregate(-advantages * token_ratio, mask, agg_mode, denominator, horizon)
    return loss, {"pg_clipfrac": _mean(chosen.float(), mask), **_kl_metric(logp, old_logp, mask)}


def kl_cov_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                ratio: float, coef: float, agg_mode: str = "token-mean", denominator: float | None = None,
                horizon: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov: ``-A * r``, plus ``coef * |logp - old_logp|`` on ``share_of(mask, ratio)`` tokens: those with the
    highest covariance, whatever its sign. Metrics: ``kl_cov_frac`` (that share), ``ppo_kl``."""
    cov = covariance(logp, advantages, mask)
    chosen = top_tokens(cov, mask.bool(), share_of(mask, ratio))
    per_token = -advantages * torch.exp(logp - old_logp) + coef * chosen * (logp - old_logp).abs()
    loss = aggregate(per_token, mask, agg_mode, denominator, horizon)
    return loss, {"kl_cov_frac": _mean(chosen.float(), mask), **_kl_metric(logp, old_logp, mask)}


def divergence(logp: torch.Tensor, old_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """(B, R) -> (B, R): how far the sampled token's probability moved: ``tv`` |p - q|, or ``binary_kl``
    KL(Bernoulli(q) || Bernoulli(p)), p = exp(logp), q = exp(old_logp) (no gradient)."""
    p, q = torch.exp(logp.detach()), torch.exp(old_logp.detach())
    if kind == "tv":
        return (p - q).abs()
    if kind == "binary_kl":
        tiny = torch.finfo(p.dtype).tiny
        p, q = p.clamp(tiny, 1 - 1e-7), q.clamp(tiny, 1 - 1e-7)
        return q * (q.log() - p.log()) + (1 - q) * (torch.log1p(-q) - torch.log1p(-p))
    raise ValueError(f"unknown divergence {kind!r}; allowed: tv, binary_kl")


def dppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              kind: str, delta: float, agg_mode: str = "token-mean", denominator: float | None = None,
              horizon: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO: ``-A * r``, its gradient dropped where ``divergence(kind) > delta`` and the probability moved in the
    advantage's direction. Metrics: ``pg_clipfrac`` (share of tokens whose gradient was dropped), ``ppo_kl``."""
    moved = (logp - old_logp).detach()
    outward = ((advantages > 0) & (moved > 0)) | ((advantages < 0) & (moved < 0))
    outside = (divergence(logp, old_logp, kind) > delta) & outward
    token_ratio = torch.exp(logp - old_logp)
    token_ratio = torch.where(outside, token_ratio.detach(), token_ratio)
    loss = aggregate(-advantages * token_ratio, mask, agg_mode, denominator, horizon)
    return loss, {"pg_clipfrac": _mean(outside.float(), mask), **_kl_metric(logp, old_logp, mask)}


# ---- each loss's actor keys ---------------------------------------------------------------------


def _agg(cfg: ActorConfig) -> dict[str, Any]:
    return {"agg_mode": cfg.loss_agg_mode, "horizon": cfg.loss_horizon}


def cispo_settings(cfg: ActorConfig) -> dict[str, Any]:
    return {"clip_low": cfg.cispo_clip_low, "clip_high": cfg.cispo_clip_high, **_agg(cfg)}


def sapo_settings(cfg: ActorConfig) -> dict[str, Any]:
    return {"tau_pos": cfg.sapo_tau_pos, "tau_neg": cfg.sapo_tau_neg, **_agg(cfg)}


def gmpo_settings(cfg: ActorConfig) -> dict[str, Any]:
    return {"clip_low": cfg.gmpo_clip_low, "clip_high": cfg.gmpo_clip_high}


def gpg_settings(cfg: ActorConfig) -> dict[str, Any]:
    return _agg(cfg)


def clip_cov_settings(cfg: ActorConfig) -> dict[str, Any]:
    return {"ratio": cfg.clip_cov_ratio, "lower": cfg.clip_cov_lb, "upper": cfg.clip_cov_ub, **_agg(cfg)}


def kl_cov_settings(cfg: ActorConfig) -> dict[str, Any]:
    return {"ratio": cfg.kl_cov_ratio, "coef": cfg.kl_cov_coef, **_agg(cfg)}


def dppo_tv_settings(cfg: ActorConfig) -> dict[str, Any]:
    return {"kind": "tv", "delta": cfg.dppo_tv_delta, **_agg(cfg)}


def dppo_kl_settings(cfg: ActorConfig) -> dict[str, Any]:
    return {"kind": "binary_kl", "delta": cfg.dppo_kl_delta, **_agg(cfg)}


LOSS_KEYS: dict[str, tuple[str, ...]] = {
    "cispo": ("actor.cispo_clip_low", "actor.cispo_clip_high"),
    "sapo": ("actor.sapo_tau_pos", "actor.sapo_tau_neg"),
    "gmpo": ("actor.gmpo_clip_low", "actor.gmpo_clip_high"),
    "clip_cov": ("actor.clip_cov_ratio", "actor.clip_cov_lb", "actor.clip_cov_ub"),
    "kl_cov": ("actor.kl_cov_ratio", "actor.kl_cov_coef"),
    "dppo_tv": ("actor.dppo_tv_delta",),
    "dppo_kl": ("actor.dppo_kl_delta",),
}
"""The ``actor`` keys each of these losses reads (a key set under another loss is refused: it would be ignored)."""
