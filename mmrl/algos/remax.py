"""ReMax (Li et al., 2024): REINFORCE whose baseline is the reward of a greedy rollout of the same prompt."""

from __future__ import annotations

import torch

from mmrl.algos.reinforce_pp import returns_to_go


@torch.no_grad()
def remax_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, baseline_scores: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """token_rewards, response_mask (B, R), baseline_scores (B,) -> (advantages, returns), each (B, R).

    returns: undiscounted returns-to-go of the token rewards; advantages: ``returns - baseline_i`` on
    row i's valid tokens, not whitened. Both 0 on padding; no gradient.
    """
    returns = returns_to_go(token_rewards, response_mask, 1.0)
    mask = response_mask.to(returns.dtype)
    advantages = (returns - baseline_scores.to(returns).unsqueeze(-1)) * mask
    return advantages, returns
