"""PPO with a learned critic (Schulman et al., 2017): per-token advantages by generalised advantage
estimation (GAE) over the critic's values, whitened over the batch; the critic regresses the returns."""

from __future__ import annotations

import torch

from mmrl import trajectory
from mmrl.algos.base import WithCritic
from mmrl.algos.masked import masked_whiten
from mmrl.protocol import Batch


@torch.no_grad()
def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    policy_mask: torch.Tensor,
    gamma: float,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the policy's tokens; ``(advantages, returns)``, not whitened.

    token_rewards, values, policy_mask: (B, R); ``lam`` a float or one lambda per row (B,). The recursion
    runs over each row's policy tokens as if the holes were not there (:mod:`mmrl.trajectory`): the token
    before a hole bootstraps from the value of the first policy token after it, and the episode ends at the
    last policy token (the value after it is 0). Rewards and values at holes and padding are ignored.
    ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``, ``returns = A + V``, in
    the values' dtype; both are 0 at holes and padding. No gradient flows through either.
    """
    mask = trajectory.prefix_mask(policy_mask).to(values.dtype)
    rewards = trajectory.close_holes(token_rewards, policy_mask).to(values.dtype)
    values = trajectory.close_holes(values, policy_mask)
    discount = gamma * (lam.to(values) if isinstance(lam, torch.Tensor) else lam)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[-1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = (delta + discount * next_adv) * mask[:, t]
        next_value = values[:, t]
        advantages[:, t] = next_adv
    returns = (advantages + values) * mask
    return trajectory.open_holes(advantages, policy_mask), trajectory.open_holes(returns, policy_mask)


@torch.no_grad()
def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    policy_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's estimator: :func:`gae` with one ``lam``, the advantages whitened over the policy's tokens of the
    batch, the returns not. token_rewards, values, policy_mask (B, R) -> (advantages, returns), each (B, R).
    """
    advantages, returns = gae(token_rewards, values, policy_mask, gamma, lam)
    return masked_whiten(advantages, policy_mask.to(values.dtype)), returns


class PPO(WithCritic):
    config_keys = ("algorithm.gamma", "algorithm.lam")

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("token_level_rewards", "values", "response_mask")
        advantages, returns = gae_advantages(batch["token_level_rewards"], batch["values"],
                                             trajectory.policy_mask(batch), self.cfg.gamma, self.cfg.lam)
        return Batch(tensors={"advantages": advantages, "returns": returns})
