"""GMPO (Geometric-Mean Policy Optimization, 2025): one term per sequence, ``-mean_A * exp(mean_t l_t)``, the
geometric mean of the token ratios, each log-ratio ``l_t`` clipped to ``[-low, high]`` in log space on the
pessimistic side (PPO's min in log space, by the sign of the advantage)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mmrl.algos.losses.metrics import kl_metric, token_mean
from mmrl.algos.losses.spec import ActorKeys, LossSpec
from mmrl.config_fields import num


@dataclass(kw_only=True)
class GMPOConfig:
    """GMPO (``actor.loss.policy=gmpo``, with a sequence ``actor.loss_agg_mode``): the token log-ratios are
    clipped to [-clip_low, clip_high] (the paper's e^+-0.4)."""

    clip_low: float = num(0.4, gt=0)
    """A token's log-ratio is clipped from below at ``-clip_low``."""
    clip_high: float = num(0.4, gt=0)
    """A token's log-ratio is clipped from above at ``clip_high``."""


def gmpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              clip_low: float, clip_high: float, denominator: float | None = None
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO: per sequence ``-mean_t(A) * exp(mean_t(l_t))``, ``l_t = sign(A) * min(sign(A) * x, sign(A) *
    clip(x, -clip_low, clip_high))`` with ``x = logp - old_logp``; summed over sequences / (B, or
    ``denominator``: a sequence count). Every tensor (B, R). A row without a policy token adds nothing. Metrics:
    ``pg_clipfrac`` (share of tokens whose clipped log-ratio was taken), ``ppo_kl``."""
    log_ratio = logp - old_logp
    sign = torch.sign(advantages)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(-clip_low, clip_high))
    lengths = mask.sum(-1)
    present = (lengths > 0).to(logp.dtype)
    safe = lengths.clamp(min=1)
    seq_ratio = torch.exp((pessimistic * mask).sum(-1) / safe)
    seq_adv = (advantages * mask).sum(-1) / safe
    count = denominator if denominator is not None else logp.shape[0]
    loss = (-seq_adv * seq_ratio * present).sum() / count
    taken = (pessimistic != log_ratio).float()
    return loss, {"pg_clipfrac": token_mean(taken, mask), **kl_metric(logp, old_logp, mask)}


def settings(actor: ActorKeys, own: GMPOConfig) -> dict[str, Any]:
    return {"clip_low": own.clip_low, "clip_high": own.clip_high}


SPEC = LossSpec("gmpo", gmpo_loss, section=GMPOConfig, settings=settings, sequence_agg=True)
"""Not linear: the advantage's sign picks the clipped side of a whole sequence's ratio."""
