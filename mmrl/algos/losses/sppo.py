"""SPPO (Wu et al., 2024): each sequence's log-ratio regressed onto its centred win rate in the group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mmrl.algos.losses.spec import ActorKeys, LossSpec
from mmrl.config_fields import num


@dataclass(kw_only=True)
class SPPOConfig:
    """SPPO (``actor.loss.policy=sppo``, the sppo algorithm's own; it reads the win rates that algorithm computes)."""

    eta: float = num(1.0, gt=0)
    """The scale of the target ``eta * (win rate - 1/2)`` the sequence log-ratio is pushed to."""


def sppo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    win_rates: torch.Tensor,
    mask: torch.Tensor,
    *,
    eta: float,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SPPO: regress each sequence's log-ratio on its centred win rate, ``(log_ratio_i - eta (P_i - 1/2))^2``.

    logp, old_logp, mask: (B, R); win_rates: (B,), the estimated probability that sample i beats the
    policy. ``log_ratio_i`` sums ``logp - old_logp`` over row i's valid tokens. Loss: sum over sequences /
    (B, or ``denominator``). Metrics, as means over valid tokens (a sequence weighs by its length):
    ``sppo_log_ratio`` (of log_ratio_i), ``sppo_target`` (of eta (P_i - 1/2)) and ``ppo_kl`` (of
    old_logp - logp).
    """
    if win_rates.shape != logp.shape[:1]:
        raise ValueError(f"win_rates must have shape ({logp.shape[0]},), got {tuple(win_rates.shape)}")
    log_ratio = ((logp - old_logp) * mask).sum(-1)
    target = eta * (win_rates - 0.5)
    per_seq = (log_ratio - target).square()
    count = denominator if denominator is not None else per_seq.shape[0]
    loss = per_seq.sum() / count
    lengths = mask.sum(-1)
    valid = lengths.sum().clamp(min=1)
    with torch.no_grad():
        metrics = {
            "sppo_log_ratio": float((log_ratio * lengths).sum() / valid),
            "sppo_target": float((target * lengths).sum() / valid),
            "ppo_kl": float((-log_ratio).sum() / valid),
        }
    return loss, metrics


def sppo_on_win_rates(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eta: float,
    win_rates: torch.Tensor,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`sppo_loss` on the batch's ``win_rates`` (B,) (:mod:`mmrl.algos.sppo` computes them); the advantages
    are not read. logp, old_logp, mask: (B, R); ``denominator`` a sequence count (a sequence ``loss_agg_mode``:
    the spec says ``sequence_agg``).

    A row without a policy token (a dispatcher's padding copy) has no log-ratio to regress: its rate is taken
    as 1/2, a target of 0, so that it adds nothing to the loss.
    """
    win_rates = win_rates.to(logp.dtype).masked_fill(mask.sum(-1) == 0, 0.5)
    return sppo_loss(logp, old_logp, win_rates, mask, eta=eta, denominator=denominator)


def settings(actor: ActorKeys, own: SPPOConfig) -> dict[str, Any]:
    return {"eta": own.eta}


SPEC = LossSpec("sppo", sppo_on_win_rates, section=SPPOConfig, settings=settings, fields=("win_rates",),
                sequence_agg=True)
