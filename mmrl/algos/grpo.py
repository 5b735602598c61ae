"""GRPO (Shao et al., 2024): the group of n responses to one prompt is its own baseline.

``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)``, the same for every token of response i. With
``algorithm.norm_adv_by_std=false`` the division is skipped (Dr. GRPO's estimator).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmrl.algos.base import OutcomeAlgorithm
from mmrl.algos.groups import group_stats


def grpo_advantages(
    scores: torch.Tensor, uids: Sequence[str], *, norm_by_std: bool = True, epsilon: float = 1e-6
) -> torch.Tensor:
    """scores (B,) float, uids: B group ids -> advantages (B,). A singleton group gets advantage 0."""
    count, mean, std = group_stats(scores, uids)
    centred = torch.where(count > 1, scores - mean, torch.zeros_like(scores))
    return centred / (std + epsilon) if norm_by_std else centred


class GRPO(OutcomeAlgorithm):
    min_group_size = 2
    config_keys = ("algorithm.norm_adv_by_std", "algorithm.epsilon")

    def outcome_advantages(self, scores: torch.Tensor, uids: Sequence[str]) -> torch.Tensor:
        return grpo_advantages(scores, uids, norm_by_std=self.cfg.norm_adv_by_std, epsilon=self.cfg.epsilon)
