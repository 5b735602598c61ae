"""Per-token estimators of KL(policy || reference) from sampled tokens (``actor.kl_estimator`` for the KL loss,
``algorithm.kl_penalty`` for the penalty in the reward)."""

from __future__ import annotations

import torch


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens; (B, R) -> (B, R).

    k1: ``logp - ref``; k2: ``0.5 (logp - ref)^2``; k3 / low_var_kl: ``exp(ref - logp) - (ref - logp) - 1``
    (unbiased, non-negative; low_var_kl also clamps to [-10, 10] for stability); abs: ``|logp - ref|``.
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
    if estimator == "abs":
        return diff.abs()
    raise ValueError(f"unknown kl estimator {estimator!r}; allowed: k1, k2, k3, low_var_kl, abs")
