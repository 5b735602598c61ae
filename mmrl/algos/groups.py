"""Group statistics over the n responses of each prompt (samples sharing a ``uid``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_index(uids: Sequence[str]) -> tuple[torch.Tensor, int]:
    """uids (B,) -> group index (B,) in 0..G-1 (in order of first appearance) and G."""
    ids: dict[str, int] = {}
    index = torch.tensor([ids.setdefault(u, len(ids)) for u in uids], dtype=torch.long)
    return index, len(ids)


def group_stats(scores: torch.Tensor, uids: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """scores (B,) -> per-sample group size, group mean and unbiased group std (0 for singletons); each (B,)."""
    index, num_groups = group_index(uids)
    scores = scores.float()
    count = torch.zeros(num_groups).index_add_(0, index, torch.ones_like(scores))
    total = torch.zeros(num_groups).index_add_(0, index, scores)
    mean = total / count
    sq_dev = torch.zeros(num_groups).index_add_(0, index, (scores - mean[index]) ** 2)
    std = torch.where(count > 1, (sq_dev / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(count))
    return count[index], mean[index], std[index]
