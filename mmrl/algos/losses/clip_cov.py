"""Clip-Cov (Cui et al., 2025): ``-A * r``, the ratio detached on the tokens of highest covariance within a window
(:mod:`mmrl.algos.losses.covariance`): fewer when fewer lie in it. ``r_t = exp(logp_t - old_logp_t)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mmrl.algos.aggregation import aggregate
from mmrl.algos.losses.covariance import covariance, share_of, top_tokens
from mmrl.algos.losses.metrics import kl_metric, token_mean
from mmrl.algos.losses.spec import ActorKeys, LossSpec, agg_settings
from mmrl.config_fields import ConfigError, num


@dataclass(kw_only=True)
class ClipCovConfig:
    """Clip-Cov (``actor.loss.policy=clip_cov``): the share of tokens detached, among those whose covariance lies in
    [lb, ub] (the paper's)."""

    ratio: float = num(2e-4, gt=0, le=1)
    """The share of the valid tokens detached."""
    lb: float = num(1.0, ge=0)
    """The window's lower bound on a token's covariance (below ``ub``)."""
    ub: float = num(5.0, gt=0)
    """The window's upper bound."""

    def __post_init__(self) -> None:
        if self.lb >= self.ub:
            raise ConfigError(f"actor.loss.clip_cov.lb={self.lb} must be below actor.loss.clip_cov.ub={self.ub}")


def clip_cov_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                  ratio: float, lower: float, upper: float, agg_mode: str = "token-mean",
                  denominator: float | None = None, horizon: float | None = None
                  ) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov: ``-A * r``, detached on ``share_of(mask, ratio)`` tokens (fewer when fewer lie in the window):
    those with the highest covariance within ``[lower, upper]``. Every tensor (B, R). Metrics: ``pg_clipfrac`` (the
    detached share), ``ppo_kl``."""
    cov = covariance(logp, advantages, mask)
    valid = mask.bool()
    chosen = top_tokens(cov, valid & (cov >= lower) & (cov <= upper), share_of(mask, ratio))
    token_ratio = torch.exp(logp - old_logp)
    token_ratio = torch.where(chosen, token_ratio.detach(), token_ratio)
    loss = aggregate(-advantages * token_ratio, mask, agg_mode, denominator, horizon)
    return loss, {"pg_clipfrac": token_mean(chosen.float(), mask), **kl_metric(logp, old_logp, mask)}


def settings(actor: ActorKeys, own: ClipCovConfig) -> dict[str, Any]:
    return {"ratio": own.ratio, "lower": own.lb, "upper": own.ub, **agg_settings(actor)}


SPEC = LossSpec("clip_cov", clip_cov_loss, section=ClipCovConfig, settings=settings)
"""Not linear: its token choice reads the advantages."""
