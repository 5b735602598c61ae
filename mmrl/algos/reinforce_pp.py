"""REINFORCE++ (Hu, 2025): critic-free per-token advantages, normalised over the whole batch.

The plain estimator whitens discounted returns-to-go over every valid token of the batch; the
group-baseline variant first centres each response's score on the mean of its prompt's group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from mmrl import trajectory
from mmrl.algos.base import Algorithm
from mmrl.algos.groups import group_stats
from mmrl.algos.masked import masked_whiten
from mmrl.protocol import Batch


@torch.no_grad()
def returns_to_go(token_rewards: torch.Tensor, policy_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """token_rewards, policy_mask (B, R) -> returns (B, R), ``G_t = sum_{k >= t} gamma^(k - t) r_k``, with t
    and k counting the row's policy tokens only.

    The sum runs over the policy's tokens as if the holes were not there (:mod:`mmrl.trajectory`): a hole
    is no step of the discount. Rewards at holes and padding are ignored (even non-finite ones); the returns
    are 0 there.
    """
    mask = trajectory.prefix_mask(policy_mask).to(token_rewards.dtype)
    rewards = trajectory.close_holes(token_rewards, policy_mask)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[-1])):
        running = (rewards[:, t] + gamma * running) * mask[:, t]
        returns[:, t] = running
    return trajectory.open_holes(returns, policy_mask)


@torch.no_grad()
def reinforce_pp_advantages(
    token_rewards: torch.Tensor, policy_mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """token_rewards, policy_mask (B, R) -> (advantages, returns), each (B, R) and 0 at holes and padding.

    returns: :func:`returns_to_go` with ``gamma``; advantages: the returns whitened over the policy's
    tokens of the batch. No gradient flows through either.
    """
    returns = returns_to_go(token_rewards, policy_mask, gamma)
    return masked_whiten(returns, policy_mask.to(returns.dtype)), returns


@torch.no_grad()
def reinforce_pp_baseline_advantages(
    token_rewards: torch.Tensor, policy_mask: torch.Tensor, uids: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """token_rewards, policy_mask (B, R), uids: B group ids -> (advantages, returns), each (B, R).

    ``score_i`` is the sum of row i's token rewards on its policy tokens, ``centred_i = score_i -
    mean(group)`` (0 in a group of one). returns: centred_i on every policy token of row i; advantages:
    those returns whitened over the policy's tokens of the batch. Both 0 at holes and padding; no gradient.
    """
    mask = policy_mask.to(token_rewards.dtype)
    scores = torch.where(mask > 0, token_rewards, torch.zeros_like(token_rewards)).sum(-1)
    count, mean, _ = group_stats(scores, uids)
    count, mean = count.to(scores.device), mean.to(scores)
    centred = torch.where(count > 1, scores - mean, torch.zeros_like(scores))
    returns = centred.unsqueeze(-1) * mask
    return masked_whiten(returns, mask), returns


class ReinforcePP(Algorithm):
    """REINFORCE++ (Hu, 2025): no critic; token-level returns of the rewards (with the KL penalty in them,
    ``algorithm.use_kl_in_reward=true`` in configs/algos/reinforce_plus_plus.yaml), whitened over the batch."""

    config_keys: ClassVar[tuple[str, ...]] = ("algorithm.gamma",)

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("token_level_rewards", "response_mask")
        advantages, returns = reinforce_pp_advantages(batch["token_level_rewards"],
                                                      trajectory.policy_mask(batch), self.cfg.gamma)
        return Batch(tensors={"advantages": advantages, "returns": returns})


class ReinforcePPBaseline(Algorithm):
    """REINFORCE++ with a group baseline: each response's reward minus its group's mean, whitened over the batch."""

    min_group_size: ClassVar[int] = 2

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("token_level_rewards", "response_mask", "uid")
        advantages, returns = reinforce_pp_baseline_advantages(batch["token_level_rewards"],
                                                               trajectory.policy_mask(batch), batch["uid"])
        return Batch(tensors={"advantages": advantages, "returns": returns})
