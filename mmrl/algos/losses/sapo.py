"""SAPO (Qwen, Soft Adaptive Policy Optimization, 2025): ``-(4 / tau) * sigmoid(tau * (r - 1)) * A`` with ``tau =
tau_pos`` for positive advantages and ``tau_neg`` for negative ones: a smooth gate in place of the hard clip (its
gradient is the plain one at ``r = 1`` and fades away from it). ``r_t = exp(logp_t - old_logp_t)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mmrl.algos.aggregation import aggregate
from mmrl.algos.losses.metrics import kl_metric, token_mean
from mmrl.algos.losses.spec import ActorKeys, LossSpec, agg_settings
from mmrl.config_fields import num


@dataclass(kw_only=True)
class SAPOConfig:
    """SAPO (``actor.loss.policy=sapo``): the gate's temperatures for positive and negative advantages (the
    paper's)."""

    tau_pos: float = num(1.0, gt=0)
    """The gate's temperature on tokens of positive advantage."""
    tau_neg: float = num(1.05, gt=0)
    """The gate's temperature on the others."""


def sapo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              tau_pos: float, tau_neg: float, agg_mode: str = "token-mean", denominator: float | None = None,
              horizon: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO: ``-(4 / tau) * sigmoid(tau * (r - 1)) * A``, ``tau`` by the advantage's sign; every tensor (B, R).
    Metrics: ``sapo_gate`` (the mean of ``4 sigmoid (1 - sigmoid)``, the factor on each token's plain gradient: 1
    on-policy), ``ppo_kl``."""
    ratio = torch.exp(logp - old_logp)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1))
    loss = aggregate(-(4 / tau) * gate * advantages, mask, agg_mode, denominator, horizon)
    factor = (4 * gate * (1 - gate)).detach()
    return loss, {"sapo_gate": token_mean(factor, mask), **kl_metric(logp, old_logp, mask)}


def settings(actor: ActorKeys, own: SAPOConfig) -> dict[str, Any]:
    return {"tau_pos": own.tau_pos, "tau_neg": own.tau_neg, **agg_settings(actor)}


SPEC = LossSpec("sapo", sapo_loss, section=SAPOConfig, settings=settings, linear=True)
