"""Metrics the losses share: means over the valid tokens of the batch a loss is given."""

from __future__ import annotations

import torch


def token_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """values, mask (B, R) -> the mean of ``values`` over the tokens where ``mask`` is set (0 when none)."""
    return float((values * mask).sum() / mask.sum().clamp(min=1))


def kl_metric(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``ppo_kl``: the mean of ``old_logp - logp`` over the valid tokens."""
    return {"ppo_kl": token_mean((old_logp - logp).detach(), mask)}


def clip_metrics(clipped: torch.Tensor, unclipped: torch.Tensor, log_ratio: torch.Tensor,
                 mask: torch.Tensor) -> dict[str, float]:
    """A clipped surrogate's metrics, each (B, R) in: ``pg_clipfrac`` (the share of valid tokens where the clipped
    term was taken) and ``ppo_kl`` (the mean of ``-log_ratio``, i.e. of old_logp - logp)."""
    with torch.no_grad():
        return {"pg_clipfrac": token_mean((clipped > unclipped).float(), mask), "ppo_kl": token_mean(-log_ratio, mask)}
