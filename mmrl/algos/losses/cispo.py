"""CISPO (MiniMax-M1, 2025): ``-sg(clip(r, 1 - low, 1 + high)) * A * logp``: the importance weight is clipped and
held constant, so a clipped token still gets a gradient (PPO's clip drops it). ``r_t = exp(logp_t -
old_logp_t)``; ``sg`` is stop-gradient."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mmrl.algos.aggregation import aggregate
from mmrl.algos.losses.metrics import kl_metric, token_mean
from mmrl.algos.losses.spec import ActorKeys, LossSpec, agg_settings
from mmrl.config_fields import num


@dataclass(kw_only=True)
class CISPOConfig:
    """CISPO (``actor.loss.policy=cispo``): its importance weight is clipped to [1 - clip_low, 1 + clip_high] (the
    defaults: no lower bound, at most 5, as ScaleRL ran it)."""

    clip_low: float = num(1.0, ge=0, le=1)
    """The weight's lower bound is ``1 - clip_low`` (1: none)."""
    clip_high: float = num(4.0, gt=0)
    """The weight's upper bound is ``1 + clip_high``."""


def cispo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
               clip_low: float, clip_high: float, agg_mode: str = "token-mean", denominator: float | None = None,
               horizon: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: ``-sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * logp``; every tensor (B, R), ``denominator`` and
    ``horizon`` as in :func:`~mmrl.algos.aggregation.aggregate`. Metrics: ``pg_clipfrac`` (share of tokens whose
    weight was clipped), ``ppo_kl``."""
    ratio = torch.exp(logp - old_logp).detach()
    weight = ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = aggregate(-weight * advantages * logp, mask, agg_mode, denominator, horizon)
    clipped = ((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float()
    return loss, {"pg_clipfrac": token_mean(clipped, mask), **kl_metric(logp, old_logp, mask)}


def settings(actor: ActorKeys, own: CISPOConfig) -> dict[str, Any]:
    return {"clip_low": own.clip_low, "clip_high": own.clip_high, **agg_settings(actor)}


SPEC = LossSpec("cispo", cispo_loss, section=CISPOConfig, settings=settings, linear=True)
