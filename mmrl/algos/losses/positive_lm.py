"""VAPO's positive-example LM loss (Yue et al., 2025), an extra loss: the NLL of the tokens of the samples the
verifier accepted, added to the policy loss with the weight ``actor.loss.positive_lm.coef``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmrl.algos.losses.spec import LossSpec
from mmrl.config_fields import num


@dataclass(kw_only=True)
class PositiveLMConfig:
    """VAPO's positive-example LM loss (an extra loss the vapo algorithm adds to its policy loss)."""

    coef: float = num(0.0, ge=0)
    """Weight of the NLL of the verified-correct samples' tokens, summed and divided by the policy loss's
    denominator (0: off)."""


def positive_lm_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    positive: torch.Tensor,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """VAPO's positive-example LM loss: the NLL of the tokens of positive (correct) samples only.

    logp, mask: (B, R); positive: (B,) bool. Token-mean over the positive samples' valid tokens, or
    divided by ``denominator`` (the global count of such tokens) when given; with no positive sample a
    zero that still carries ``logp``'s graph. Metrics, as means over all valid tokens: ``positive_token_frac``
    (share of tokens in positive samples) and ``positive_nll`` (-logp on those tokens, 0 elsewhere; divided
    by ``positive_token_frac`` it gives the NLL per positive token).
    """
    if positive.shape != logp.shape[:1]:
        raise ValueError(f"positive must have shape ({logp.shape[0]},), got {tuple(positive.shape)}")
    selected = mask * positive.to(mask.dtype).unsqueeze(-1)
    nll = -logp * selected
    count = denominator if denominator is not None else selected.sum().clamp(min=1)
    loss = nll.sum() / count
    valid = mask.sum().clamp(min=1)
    with torch.no_grad():
        metrics = {
            "positive_token_frac": float(selected.sum() / valid),
            "positive_nll": float(nll.sum() / valid),
        }
    return loss, metrics


def positive_lm(logp: torch.Tensor, mask: torch.Tensor, *, denominator: float | None = None,
                correct: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`positive_lm_loss` on the verified-correct samples: logp, mask (B, R), correct (B,) (1 where the
    verifier accepted the sample); ``denominator`` the policy loss's."""
    return positive_lm_loss(logp, mask, correct.bool(), denominator)


SPEC = LossSpec("positive_lm", positive_lm, kind="extra", section=PositiveLMConfig, fields=("correct",))
