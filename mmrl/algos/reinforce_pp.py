"""REINFORCE++ (Hu, 2025): critic-free per-token advantages, normalised over the whole batch.

The plain estimator whitens discounted returns-to-go over every valid token of the batch; the
group-baseline variant first centres each response's score on the mean of its prompt's group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmrl.algos.groups import group_stats
from mmrl.algos.masked import masked_whiten


@torch.no_grad()
def returns_to_go(token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """token_rewards, response_mask (B, R) -> returns (B, R), ``G_t = sum_{k>=t, k valid} gamma^(k-t) r_k``.

    Rewards at padding are ignored (even non-finite ones); the returns are 0 there.
    """
    mask = response_mask.to(token_rewards.dtype)
    rewards = torch.where(mask > 0, token_rewards, torch.zeros_like(token_rewards))
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[-1])):
        running = (rewards[:, t] + gamma * running) * mask[:, t]
        returns[:, t] = running
    return returns


@torch.no_grad()
def reinforce_pp_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """token_rewards, response_mask (B, R) -> (advantages, returns), each (B, R) and 0 on padding.

    returns: :func:`returns_to_go` with ``gamma``; advantages: the returns whitened over all valid
    tokens of the batch. No gradient flows through either.
    """
    returns = returns_to_go(token_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask.to(returns.dtype)), returns


@torch.no_grad()
def reinforce_pp_baseline_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, uids: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """token_rewards, response_mask (B, R), uids: B group ids -> (advantages, returns), each (B, R).

    ``score_i`` is the sum of row i's valid token rewards, ``centred_i = score_i - mean(group)`` (0 in a
    group of one). returns: centred_i on every valid token of row i; advantages: those returns whitened
    over all valid tokens of the batch. Both 0 on padding; no gradient.
    """
    mask = response_mask.to(token_rewards.dtype)
    scores = torch.where(mask > 0, token_rewards, torch.zeros_like(token_rewards)).sum(-1)
    count, mean, _ = group_stats(scores, uids)
    count, mean = count.to(scores.device), mean.to(scores)
    centred = torch.where(count > 1, scores - mean, torch.zeros_like(scores))
    returns = centred.unsqueeze(-1) * mask
    return masked_whiten(returns, mask), returns
