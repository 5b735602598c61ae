"""KL regularisation in the reward: a per-token penalty toward the reference policy, and the
controllers that set its coefficient (fixed, or adaptive after Ziegler et al., 2019)."""

from __future__ import annotations

import torch

from mmrl.algos.kl import kl_penalty
from mmrl.config import AlgorithmConfig


@torch.no_grad()
def kl_in_reward(
    token_rewards: torch.Tensor,
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    policy_mask: torch.Tensor,
    coef: float,
    estimator: str,
) -> tuple[torch.Tensor, float]:
    """token_rewards, log_probs, ref_log_probs, policy_mask (B, R) -> (new_token_rewards (B, R), mean_kl).

    Subtracts ``coef * kl_t`` (``kl_t`` from :func:`~mmrl.algos.losses.kl_penalty` with ``estimator``)
    on the policy's tokens; holes and padding keep their reward. ``mean_kl``: the per-sequence mean KL over
    the policy's tokens, averaged over the B sequences.
    """
    valid = policy_mask > 0
    # log-probs off the policy's tokens may be garbage (even -inf): out of both the rewards and the mean
    kl = torch.where(valid, kl_penalty(log_probs, ref_log_probs, estimator), torch.zeros_like(log_probs))
    new_rewards = token_rewards - coef * kl.to(token_rewards.dtype)
    per_seq = kl.sum(-1) / valid.sum(-1).clamp(min=1)
    return new_rewards, float(per_seq.mean())


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, coef: float) -> None:
        self.value = coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


class AdaptiveKLController:
    """Ziegler et al. (2019): moves the coefficient so that the observed KL tracks ``target_kl``.

    ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``, ``value *= 1 + e * n_steps / horizon``.
    """

    def __init__(self, init_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = init_coef
        self.target_kl = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adapt after ``n_steps`` samples (or steps) whose mean KL was ``current_kl``."""
        error = min(max(current_kl / self.target_kl - 1, -0.2), 0.2)
        self.value *= 1 + error * n_steps / self.horizon


def build_kl_controller(cfg: AlgorithmConfig) -> FixedKLController | AdaptiveKLController:
    """The reward penalty's controller: ``algorithm.kl_ctrl`` fixed at ``kl_coef``, or adaptive from it."""
    if cfg.kl_ctrl == "adaptive":
        return AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
    return FixedKLController(cfg.kl_coef)
