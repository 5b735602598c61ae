"""The token choice Clip-Cov and KL-Cov share (Cui et al., The Entropy Mechanism of RL for Reasoning LMs, 2025):
the tokens whose centred covariance ``(logp_t - mean logp) * (A_t - mean A)`` is highest drive the entropy down.
The means are over the valid tokens of the batch the loss is given (a micro-batch in the update); each loss picks
``max(1, floor(ratio * valid tokens))`` of them, as the paper and verl do, by rank where the paper draws at
random."""

from __future__ import annotations

import math

import torch

from mmrl.algos.losses.metrics import token_mean


def covariance(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, R) -> (B, R): ``(logp - mean logp) * (A - mean A)``, the means over the valid tokens (no gradient)."""
    logp, advantages = logp.detach(), advantages.detach()
    return (logp - token_mean(logp, mask)) * (advantages - token_mean(advantages, mask))


def top_tokens(scores: torch.Tensor, eligible: torch.Tensor, k: int) -> torch.Tensor:
    """(B, R) bool: the (at most) ``k`` eligible tokens with the highest score."""
    chosen = torch.zeros_like(eligible)
    k = min(k, int(eligible.sum()))
    if k:
        flat = torch.where(eligible, scores, torch.full_like(scores, -math.inf)).flatten()
        chosen.view(-1)[torch.topk(flat, k).indices] = True
    return chosen


def share_of(mask: torch.Tensor, share: float) -> int:
    """``max(1, floor(share * valid tokens))`` (0 without valid tokens): how many tokens a covariance loss picks."""
    valid = int(mask.sum())
    return max(1, math.floor(share * valid)) if valid else 0
