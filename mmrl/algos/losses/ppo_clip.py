"""PPO's clipped surrogate (Schulman et al., 2017), with DAPO's asymmetric clip-higher (``clip_low != clip_high``)
and the dual-clip cap (Ye et al., 2020) that :mod:`mmrl.algos.losses.dual_clip` turns on."""

from __future__ import annotations

import torch

from mmrl.algos.aggregation import aggregate
from mmrl.algos.losses.metrics import clip_metrics, token_mean
from mmrl.algos.losses.spec import LossSpec, clip_settings


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str = "token-mean",
    denominator: float | None = None,
    clip_ratio_c: float | None = None,
    horizon: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate, ``-min(ratio * A, clip(ratio, 1-low, 1+high) * A)``, aggregated.

    logp, old_logp, advantages, mask: (B, R). ``clip_low != clip_high`` gives DAPO's asymmetric clip-higher.
    With ``clip_ratio_c`` (> 1, dual-clip PPO) a negative-advantage token's loss is further capped at
    ``-A * clip_ratio_c``, so that a very large ratio cannot push its loss (and gradient) without bound;
    positive-advantage tokens are unchanged. ``denominator`` and ``horizon`` as in :func:`aggregate`.
    Returns the loss and metrics: ``pg_clipfrac`` (share of valid tokens where the clipped term was taken),
    ``ppo_kl`` (mean of old_logp - logp) and, with ``clip_ratio_c``, ``pg_clipfrac_lower`` (share of valid
    tokens where the dual-clip cap was taken).
    """
    if clip_ratio_c is not None and not clip_ratio_c > 1:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c
        negative = advantages < 0
        capped = negative & (per_token > cap)
        per_token = torch.where(negative, torch.minimum(per_token, cap), per_token)
    loss = aggregate(per_token, mask, agg_mode, denominator, horizon)
    metrics = clip_metrics(clipped, unclipped, log_ratio, mask)
    if clip_ratio_c is not None:
        metrics["pg_clipfrac_lower"] = token_mean(capped.float(), mask)
    return loss, metrics


SPEC = LossSpec("ppo_clip", ppo_clip_loss, settings=clip_settings, linear=True)
"""Reads ``actor.clip_ratio_low``, ``actor.clip_ratio_high`` and the aggregation; no section of its own."""
