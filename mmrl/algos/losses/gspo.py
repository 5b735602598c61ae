"""GSPO (Zheng et al., 2025): PPO's clipped surrogate on a sequence-level importance ratio."""

from __future__ import annotations

import torch

from mmrl.algos.aggregation import aggregate
from mmrl.algos.losses.metrics import clip_metrics
from mmrl.algos.losses.spec import LossSpec, clip_settings


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str = "seq-mean-token-mean",
    denominator: float | None = None,
    horizon: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (GSPO-token form): PPO's clipped surrogate on a sequence-level importance ratio, aggregated.

    logp, old_logp, advantages, mask: (B, R). ``s_i = exp(mean over row i's valid tokens of
    (logp - old_logp))``; the token ratio ``s_it = sg[s_i] * exp(logp_t - sg[logp_t])`` has the value
    ``s_i`` and the gradient ``s_i * d logp_t`` (sg: stop-gradient), so per-token advantages weight each
    token's gradient. Per token: ``max(-A * s_it, -A * clip(s_it, 1-low, 1+high))``. Being a ratio of
    length-normalised likelihoods, ``s_i`` stays near 1: the clip range is narrow, typically
    ``clip_low=3e-4, clip_high=4e-4``. ``denominator`` and ``horizon`` as in :func:`aggregate`. Metrics:
    ``pg_clipfrac`` (share of valid tokens clipped, i.e. of tokens in clipped sequences when the advantage
    is constant along the row) and ``ppo_kl`` (mean of old_logp - logp over valid tokens).
    """
    log_ratio = logp - old_logp
    seq_log_ratio = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    ratio = torch.exp(seq_log_ratio.detach() + logp - logp.detach())
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = aggregate(per_token, mask, agg_mode, denominator, horizon)
    metrics = clip_metrics(clipped, unclipped, log_ratio, mask)
    return loss, metrics


SPEC = LossSpec("gspo", gspo_loss, settings=clip_settings, linear=True)
"""GSPO's clip range is ~1e-4 wide: set ``actor.clip_ratio_low/high`` accordingly (e.g. 3e-4 / 4e-4)."""
