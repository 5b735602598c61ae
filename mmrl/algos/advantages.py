"""Outcome advantage estimators: one scalar reward per response, broadcast over its tokens.

Each estimator maps ``scores (B,)`` and group ids to advantages ``(B,)``; :func:`compute_advantages`
broadcasts them onto the response tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class AdvantageOptions:
    norm_adv_by_std: bool = True
    epsilon: float = 1e-6


def _group_index(uids: Sequence[str]) -> tuple[torch.Tensor, int]:
    """uids (B,) -> group index (B,) in 0..G-1 and G."""
    ids: dict[str, int] = {}
    index = torch.tensor([ids.setdefault(u, len(ids)) for u in uids], dtype=torch.long)
    return index, len(ids)


def _group_stats(scores: torch.Tensor, index: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, ...]:
    """Per-sample group size, group mean and unbiased group std (0 for singleton groups); each (B,)."""
    count = torch.zeros(num_groups).index_add_(0, index, torch.ones_like(scores))
    total = torch.zeros(num_groups).index_add_(0, index, scores)
    mean = total / count
    sq_dev = torch.zeros(num_groups).index_add_(0, index, (scores - mean[index]) ** 2)
    std = torch.where(count > 1, (sq_dev / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(count))
    return count[index], mean[index], std[index]


def grpo_advantages(scores: torch.Tensor, uids: Sequence[str], opts: AdvantageOptions) -> torch.Tensor:
    """GRPO: ``(r - mean_group) / (std_group + eps)``; without std normalisation it is Dr. GRPO.

    scores (B,) float; uids: B group ids. Returns (B,). A singleton group gets advantage 0.
    """
    index, num_groups = _group_index(uids)
    count, mean, std = _group_stats(scores.float(), index, num_groups)
    centred = torch.where(count > 1, scores - mean, torch.zeros_like(scores))
    return centred / (std + opts.epsilon) if opts.norm_adv_by_std else centred


def rloo_advantages(scores: torch.Tensor, uids: Sequence[str], opts: AdvantageOptions) -> torch.Tensor:
    """RLOO: ``r - mean of the other responses of the same prompt``. scores (B,) -> (B,)."""
    index, num_groups = _group_index(uids)
    count, mean, _ = _group_stats(scores.float(), index, num_groups)
    loo = count / (count - 1).clamp(min=1)
    return torch.where(count > 1, (scores - mean) * loo, torch.zeros_like(scores))


Estimator = Callable[[torch.Tensor, Sequence[str], AdvantageOptions], torch.Tensor]

ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
}


def compute_advantages(
    name: str, scores: torch.Tensor, uids: Sequence[str], response_mask: torch.Tensor, opts: AdvantageOptions
) -> torch.Tensor:
    """scores (B,), response_mask (B, R) -> token advantages (B, R), zero on padding."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; allowed: {', '.join(sorted(ESTIMATORS))}")
    per_sample = ESTIMATORS[name](scores, uids, opts)
    return per_sample.unsqueeze(-1) * response_mask
