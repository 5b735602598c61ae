"""GPG (Group Policy Gradient, 2025): the plain policy gradient ``-A * logp``, no ratio and no clip."""

from __future__ import annotations

import torch

from mmrl.algos.aggregation import aggregate
from mmrl.algos.losses.metrics import kl_metric
from mmrl.algos.losses.spec import LossSpec, agg_settings


def gpg_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
             agg_mode: str = "token-mean", denominator: float | None = None, horizon: float | None = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG: ``-A * logp``; every tensor (B, R). Metrics: ``ppo_kl``."""
    return aggregate(-advantages * logp, mask, agg_mode, denominator, horizon), kl_metric(logp, old_logp, mask)


SPEC = LossSpec("gpg", gpg_loss, settings=agg_settings, linear=True)
