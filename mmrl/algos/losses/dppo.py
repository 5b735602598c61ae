"""DPPO (a trust region on the probability, not the ratio; prime-rl's default loss), a family of two:
``-A * r`` whose gradient is dropped where the token's probability has moved beyond ``delta`` from the old one *in
the advantage's direction* (up for A > 0, down for A < 0), the divergence measured as total variation ``|p - q|``
(``dppo_tv``) or as the binary KL ``q log(q/p) + (1-q) log((1-q)/(1-p))`` (``dppo_kl``), p and q the new and old
probabilities of the sampled token. ``r_t = exp(logp_t - old_logp_t)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mmrl.algos.aggregation import aggregate
from mmrl.algos.losses.metrics import kl_metric, token_mean
from mmrl.algos.losses.spec import ActorKeys, LossSpec, agg_settings
from mmrl.config_fields import num


@dataclass(kw_only=True)
class DPPOTVConfig:
    """DPPO-TV (``actor.loss.policy=dppo_tv``)."""

    delta: float = num(0.2, gt=0, le=1)
    """The trust region on |p - p_old| of the sampled token."""


@dataclass(kw_only=True)
class DPPOKLConfig:
    """DPPO-KL (``actor.loss.policy=dppo_kl``)."""

    delta: float = num(0.05, gt=0)
    """The trust region on the binary KL of the sampled token's probability."""


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
    advantage's direction. Every tensor (B, R). Metrics: ``pg_clipfrac`` (share of tokens whose gradient was
    dropped), ``ppo_kl``."""
    moved = (logp - old_logp).detach()
    outward = ((advantages > 0) & (moved > 0)) | ((advantages < 0) & (moved < 0))
    outside = (divergence(logp, old_logp, kind) > delta) & outward
    token_ratio = torch.exp(logp - old_logp)
    token_ratio = torch.where(outside, token_ratio.detach(), token_ratio)
    loss = aggregate(-advantages * token_ratio, mask, agg_mode, denominator, horizon)
    return loss, {"pg_clipfrac": token_mean(outside.float(), mask), **kl_metric(logp, old_logp, mask)}


def tv_settings(actor: ActorKeys, own: DPPOTVConfig) -> dict[str, Any]:
    return {"kind": "tv", "delta": own.delta, **agg_settings(actor)}


def kl_settings(actor: ActorKeys, own: DPPOKLConfig) -> dict[str, Any]:
    return {"kind": "binary_kl", "delta": own.delta, **agg_settings(actor)}


TV_SPEC = LossSpec("dppo_tv", dppo_loss, section=DPPOTVConfig, settings=tv_settings, linear=True)
KL_SPEC = LossSpec("dppo_kl", dppo_loss, section=DPPOKLConfig, settings=kl_settings, linear=True)
