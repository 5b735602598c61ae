"""OPO (On-Policy RL with Optimal reward baseline, Hao et al. 2025): the group baseline that minimises the
gradient's variance when a response's gradient norm grows with its length: the length-weighted mean reward,

    b = sum_i |o_i| r_i / sum_i |o_i|,   A_i = r_i - b,

``|o_i|`` the number of the policy's tokens of response i (OPO trains strictly on-policy: one update per batch).
"""

from __future__ import annotations

import torch

from mmrl import trajectory
from mmrl.algos.base import OutcomeAlgorithm
from mmrl.algos.groups import group_index
from mmrl.protocol import Batch


def opo_advantages(scores: torch.Tensor, lengths: torch.Tensor, uids: list[str]) -> torch.Tensor:
    """scores (B,), lengths (B,) policy tokens per response, the B group ids -> advantages (B,). A singleton
    group, or a group of empty responses, gets 0."""
    index, groups = group_index(uids)
    scores, lengths = scores.float(), lengths.float()
    weighted = torch.zeros(groups).index_add_(0, index, scores * lengths)
    total = torch.zeros(groups).index_add_(0, index, lengths)
    count = torch.zeros(groups).index_add_(0, index, torch.ones_like(scores))
    baseline = weighted / total.clamp(min=1e-12)
    usable = (count[index] > 1) & (total[index] > 0)
    return torch.where(usable, scores - baseline[index], torch.zeros_like(scores))


class OPO(OutcomeAlgorithm):
    min_group_size = 2

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("token_level_rewards", "response_mask", "uid")
        mask = trajectory.policy_mask(batch)
        per_sample = opo_advantages(batch["token_level_rewards"].sum(-1), mask.sum(-1), list(batch["uid"]))
        return Batch(tensors={"advantages": per_sample.unsqueeze(-1) * mask})
