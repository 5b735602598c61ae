"""RLOO (Ahmadian et al., 2024): each response's baseline is the mean reward of the *other* responses
to the same prompt, ``A_i = r_i - mean_{j != i} r_j = (r_i - mean) * n / (n - 1)``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmrl.algos.base import OutcomeAlgorithm
from mmrl.algos.groups import group_stats


def rloo_advantages(scores: torch.Tensor, uids: Sequence[str]) -> torch.Tensor:
    """scores (B,), uids: B group ids -> advantages (B,); 0 for a singleton group."""
    count, mean, _ = group_stats(scores, uids)
    loo = count / (count - 1).clamp(min=1)
    return torch.where(count > 1, (scores - mean) * loo, torch.zeros_like(scores))


class RLOO(OutcomeAlgorithm):
    min_group_size = 2

    def outcome_advantages(self, scores: torch.Tensor, uids: Sequence[str]) -> torch.Tensor:
        return rloo_advantages(scores, uids)
