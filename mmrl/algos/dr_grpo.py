"""Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-like training"): GRPO without its two length and
difficulty biases. The advantage is the centred group reward, not divided by the group's standard deviation,
and the loss sums each response's token losses and divides by a constant (``actor.loss_agg_mode=
seq-mean-token-sum-norm``, ``actor.loss_horizon``), not by the response's own length (configs/algos/dr_grpo.yaml)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmrl.algos.base import OutcomeAlgorithm
from mmrl.algos.grpo import grpo_advantages


class DrGRPO(OutcomeAlgorithm):
    min_group_size = 2

    def outcome_advantages(self, scores: torch.Tensor, uids: Sequence[str]) -> torch.Tensor:
        return grpo_advantages(scores, uids, norm_by_std=False)
