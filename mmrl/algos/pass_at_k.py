"""GRPO for pass@k (Chen et al., Pass@k Training for Adaptively Balancing Exploration and Exploitation, 2025): the
advantage that optimises the chance that one of k samples of a prompt is right, in its analytic form.

With binary rewards (the verifier's ``correct``), a group of N samples of which N_neg are wrong: the group's
pass@k is ``R = 1 - C(N_neg, k) / C(N, k)`` (the mean, over every k-subset, of the subset's best reward), its
spread ``sigma = sqrt(R (1 - R))``, and

    A_correct = (1 - R) / sigma
    A_wrong   = (1 - R - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / sigma

(the mean over the k-subsets holding the sample of their best reward minus R, over sigma). A group that is all
right or all wrong, or smaller than k, gets 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import comb
from typing import Any

import torch

from mmrl import trajectory
from mmrl.algos.base import OutcomeAlgorithm
from mmrl.algos.groups import group_index
from mmrl.config_fields import ConfigError, num
from mmrl.protocol import Batch


@dataclass(kw_only=True)
class PassAtKConfig:
    """GRPO for pass@k (``algorithm.name=grpo_pass_k``)."""

    k: int = num(4, ge=1)
    """The k of pass@k the advantage optimises (at most rollout.n)."""


def pass_at_k_advantages(correct: torch.Tensor, uids: Sequence[str], k: int, epsilon: float = 1e-6) -> torch.Tensor:
    """correct (B,) 0/1, the B group ids -> advantages (B,) for pass@k."""
    if k < 1:
        raise ValueError(f"algorithm.grpo_pass_k.k={k} must be >= 1")
    index, groups = group_index(uids)
    right = correct.float() > 0.5
    advantages = torch.zeros(len(uids))
    for g in range(groups):
        members = (index == g).nonzero().squeeze(-1)
        n, wrong = len(members), int((~right[members]).sum())
        if n < k or wrong in (0, n):
            continue
        mean = 1 - comb(wrong, k) / comb(n, k)
        sigma = (mean * (1 - mean)) ** 0.5 + epsilon
        when_wrong = 1 - mean - comb(wrong - 1, k - 1) / comb(n - 1, k - 1)
        advantages[members] = torch.where(right[members], torch.tensor((1 - mean) / sigma),
                                          torch.tensor(when_wrong / sigma))
    return advantages


class PassAtK(OutcomeAlgorithm):
    min_group_size = 2
    config_keys = ("algorithm.epsilon",)
    section = PassAtKConfig

    @classmethod
    def check(cls, cfg: Any) -> None:
        """``algorithm.grpo_pass_k.k`` is at most ``rollout.n``."""
        k = cfg.algorithm.grpo_pass_k.k
        if k > cfg.rollout.n:
            raise ConfigError(f"algorithm.grpo_pass_k.k={k} exceeds rollout.n={cfg.rollout.n}: pass@k is over k of "
                              "a prompt's n samples; lower k or raise rollout.n")

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("correct", "response_mask", "uid")
        per_sample = pass_at_k_advantages(batch["correct"], batch["uid"], self.cfg.grpo_pass_k.k, self.cfg.epsilon)
        return Batch(tensors={"advantages": per_sample.unsqueeze(-1) * trajectory.policy_mask(batch)})
