"""KL-Cov (Cui et al., 2025): ``-A * r``, plus ``coef * |logp - old_logp|`` on the tokens of highest covariance,
whatever its sign (:mod:`mmrl.algos.losses.covariance`). ``r_t = exp(logp_t - old_logp_t)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mmrl.algos.aggregation import aggregate
from mmrl.algos.losses.covariance import covariance, share_of, top_tokens
from mmrl.algos.losses.metrics import kl_metric, token_mean
from mmrl.algos.losses.spec import ActorKeys, LossSpec, agg_settings
from mmrl.config_fields import num


@dataclass(kw_only=True)
class KLCovConfig:
    """KL-Cov (``actor.loss.policy=kl_cov``)."""

    ratio: float = num(2e-3, gt=0, le=1)
    """The share of tokens penalised."""
    coef: float = num(1.0, ge=0)
    """The weight of their |log-ratio|."""


def kl_cov_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                ratio: float, coef: float, agg_mode: str = "token-mean", denominator: float | None = None,
                horizon: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov: ``-A * r``, plus ``coef * |logp - old_logp|`` on ``share_of(mask, ratio)`` tokens: those with the
    highest covariance, whatever its sign. Every tensor (B, R). Metrics: ``kl_cov_frac`` (that share), ``ppo_kl``."""
    cov = covariance(logp, advantages, mask)
    chosen = top_tokens(cov, mask.bool(), share_of(mask, ratio))
    per_token = -advantages * torch.exp(logp - old_logp) + coef * chosen * (logp - old_logp).abs()
    loss = aggregate(per_token, mask, agg_mode, denominator, horizon)
    return loss, {"kl_cov_frac": token_mean(chosen.float(), mask), **kl_metric(logp, old_logp, mask)}


def settings(actor: ActorKeys, own: KLCovConfig) -> dict[str, Any]:
    return {"ratio": own.ratio, "coef": own.coef, **agg_settings(actor)}


SPEC = LossSpec("kl_cov", kl_cov_loss, section=KLCovConfig, settings=settings)
"""Not linear: its token choice reads the advantages."""
