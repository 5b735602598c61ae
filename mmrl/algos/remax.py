"""ReMax (Li et al., 2023, arXiv 2310.10505): REINFORCE whose baseline is the reward of a greedy rollout of the same prompt."""

from __future__ import annotations

from dataclasses import replace

import torch

from mmrl import trajectory
from mmrl.algos.base import Algorithm, RolloutContext
from mmrl.algos.reinforce_pp import returns_to_go
from mmrl.protocol import Batch


@torch.no_grad()
def remax_advantages(
    token_rewards: torch.Tensor, policy_mask: torch.Tensor, baseline_scores: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """token_rewards, policy_mask (B, R), baseline_scores (B,) -> (advantages, returns), each (B, R).

    returns: undiscounted returns-to-go of the token rewards over the policy's tokens; advantages:
    ``returns - baseline_i`` on row i's policy tokens, not whitened. Both 0 at holes and padding; no gradient.
    """
    returns = returns_to_go(token_rewards, policy_mask, 1.0)
    mask = policy_mask.to(returns.dtype)
    advantages = (returns - baseline_scores.to(returns).unsqueeze(-1)) * mask
    return advantages, returns


class ReMax(Algorithm):
    """ReMax (Li et al., 2023): REINFORCE whose baseline is the reward of the greedy response to the same
    prompt (generated and scored in :meth:`extra_rollouts`)."""

    def extra_rollouts(self, ctx: RolloutContext, prompts: Batch, batch: Batch) -> Batch:
        """Adds ``baseline_scores`` (B,): the reward of one greedy response to each sample's prompt (the
        stage ``timing_s/baseline``)."""
        with ctx.timer("baseline"):
            greedy = ctx.generate(prompts, replace(ctx.sampling, n=1, greedy=True))
            greedy, _ = ctx.score(greedy)
        batch.tensors["baseline_scores"] = greedy["token_level_rewards"].sum(-1).repeat_interleave(ctx.sampling.n)
        return batch

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("token_level_rewards", "response_mask", "baseline_scores")
        advantages, returns = remax_advantages(batch["token_level_rewards"], trajectory.policy_mask(batch),
                                               batch["baseline_scores"])
        return Batch(tensors={"advantages": advantages, "returns": returns})
