"""Policy and value losses and KL estimators: pure functions returning ``(loss, metrics)``.

Aggregation (``loss_agg_mode``) follows verl's names:
- ``token-mean``: sum over all valid tokens / number of valid tokens;
- ``seq-mean-token-sum``: per-sequence token sums, averaged over sequences;
- ``seq-mean-token-mean``: per-sequence token means, averaged over sequences.
A ``denominator`` replaces the local count (tokens or sequences), so that several micro-batches or
data-parallel ranks add up to the mean over the whole mini-batch.

``POLICY_LOSSES`` maps ``actor.policy_loss`` names to functions of one signature (:class:`PolicyLoss`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from mmrl.config import ActorConfig


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, denominator: float | None = None) -> torch.Tensor:
    """values, mask (B, R) -> scalar.

    ``denominator`` replaces the local count (valid tokens for token-mean, sequences otherwise), so that
    partial sums over micro-batches and ranks add up to the global mean.
    """
    if mode == "token-mean":
        count = denominator if denominator is not None else mask.sum().clamp(min=1)
        return (values * mask).sum() / count
    if mode == "seq-mean-token-sum":
        per_seq = (values * mask).sum(-1)
    elif mode == "seq-mean-token-mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    else:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; allowed: token-mean, seq-mean-token-sum, seq-mean-token-mean")
    count = denominator if denominator is not None else per_seq.shape[0]
    return per_seq.sum() / count


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str = "token-mean",
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate, ``-min(ratio * A, clip(ratio, 1-low, 1+high) * A)``, aggregated.

    logp, old_logp, advantages, mask: (B, R). Returns the loss and metrics: ``pg_clipfrac`` (share of
    valid tokens where the clipped term was taken) and ``ppo_kl`` (mean of old_logp - logp).
    """
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = aggregate(per_token, mask, agg_mode, denominator)
    valid = mask.sum().clamp(min=1)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": float(((clipped > unclipped).float() * mask).sum() / valid),
            "ppo_kl": float((-log_ratio * mask).sum() / valid),
        }
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_range: float,
    agg_mode: str = "token-mean",
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss, ``0.5 * max((V - R)^2, (V_clip - R)^2)`` per token, aggregated.

    ``V_clip = old_values + clamp(values - old_values, -clip_range, clip_range)``. values, old_values,
    returns, mask: (B, R); old_values and returns are targets (detached), so the gradient flows only to
    values. ``denominator`` as in :func:`aggregate`. Metrics over the valid tokens: ``vf_clipfrac`` (share
    where the clipped term is strictly larger) and ``vpred_mean`` (mean of values).
    """
    old_values, returns = old_values.detach(), returns.detach()
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    unclipped_sq = (values - returns).square()
    clipped_sq = (clipped_values - returns).square()
    per_token = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    loss = aggregate(per_token, mask, agg_mode, denominator)
    valid = mask.sum().clamp(min=1)
    with torch.no_grad():
        metrics = {
            "vf_clipfrac": float(((clipped_sq > unclipped_sq).float() * mask).sum() / valid),
            "vpred_mean": float((values * mask).sum() / valid),
        }
    return loss, metrics


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens; (B, R) -> (B, R).

    k1: ``logp - ref``; k2: ``0.5 (logp - ref)^2``; k3 / low_var_kl: ``exp(ref - logp) - (ref - logp) - 1``
    (unbiased, non-negative; low_var_kl also clamps to [-10, 10] for stability).
    """
    diff = logp - ref_logp
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff.square()
    if estimator in ("k3", "low_var_kl"):
        neg = -diff
        if estimator == "low_var_kl":
            neg = neg.clamp(-20, 20)
        kl = torch.exp(neg) - neg - 1
        return kl.clamp(-10, 10) if estimator == "low_var_kl" else kl
    raise ValueError(f"unknown kl estimator {estimator!r}; allowed: k1, k2, k3, low_var_kl")


class PolicyLoss(Protocol):
    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        cfg: ActorConfig,
        denominator: float | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """logp, old_logp, advantages, mask: (B, R) -> (loss, metrics).

        Every metric is a mean over the valid tokens of the batch given (the updater weights it by their
        number to average over micro-batches and ranks).
        """
        ...


def ppo_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    cfg: ActorConfig,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`ppo_clip_loss` with ``actor.clip_ratio_low/high`` and ``actor.loss_agg_mode``; (B, R) inputs."""
    return ppo_clip_loss(
        logp, old_logp, advantages, mask, clip_low=cfg.clip_ratio_low, clip_high=cfg.clip_ratio_high,
        agg_mode=cfg.loss_agg_mode, denominator=denominator,
    )


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo_clip": ppo_clip,
}
