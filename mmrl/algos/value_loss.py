"""The critic's loss: PPO's clipped value loss, a pure function returning ``(loss, metrics)``."""

from __future__ import annotations

import torch

from mmrl.algos.aggregation import aggregate


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_range: float,
    agg_mode: str = "token-mean",
    denominator: float | None = None,
    horizon: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss, ``0.5 * max((V - R)^2, (V_clip - R)^2)`` per token, aggregated.

    ``V_clip = old_values + clamp(values - old_values, -clip_range, clip_range)``. values, old_values,
    returns, mask: (B, R); old_values and returns are targets (detached), so the gradient flows only to
    values. ``denominator`` as in :func:`aggregate`. Metrics over the valid tokens: ``vf_clipfrac`` (share
    where the clipped term is strictly larger) and ``vpred_mean`` (mean of values).
    """
    old_values, returns = old_values.detach(), returns.detach()
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    unclipped_sq = (values - returns).square()
    clipped_sq = (clipped_values - returns).square()
    per_token = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    loss = aggregate(per_token, mask, agg_mode, denominator, horizon)
    valid = mask.sum().clamp(min=1)
    with torch.no_grad():
        metrics = {
            "vf_clipfrac": float(((clipped_sq > unclipped_sq).float() * mask).sum() / valid),
            "vpred_mean": float((values * mask).sum() / valid),
        }
    return loss, metrics
