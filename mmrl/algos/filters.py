"""Response filters (and the win rates SPPO compares samples by), run before the update.

Each filter returns a bool keep-mask (B,) over the samples; ``uids`` are the B group ids (the samples
of one prompt share one).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmrl.algos.groups import group_index

PF_PPO_MODES = ("best_k", "best_and_worst", "random")


def _groups(uids: Sequence[str]) -> list[list[int]]:
    """The sample indices of each group, in order of first appearance."""
    index, num_groups = group_index(uids)
    members: list[list[int]] = [[] for _ in range(num_groups)]
    for i, g in enumerate(index.tolist()):
        members[g].append(i)
    return members


def mixed_groups(scores: torch.Tensor, uids: Sequence[str], tol: float = 1e-9) -> torch.Tensor:
    """DAPO's dynamic sampling: scores (B,) -> keep (B,) bool.

    Drops every sample of a group whose scores all agree (max - min <= ``tol``): they carry no
    group-relative signal. A group of one is kept.
    """
    index, num_groups = group_index(uids)
    index = index.to(scores.device)
    scores = scores.double()
    high = torch.full((num_groups,), -torch.inf, dtype=scores.dtype, device=scores.device)
    low = torch.full((num_groups,), torch.inf, dtype=scores.dtype, device=scores.device)
    high = high.scatter_reduce(0, index, scores, "amax")
    low = low.scatter_reduce(0, index, scores, "amin")
    count = torch.bincount(index, minlength=num_groups)
    return ((high - low > tol) | (count == 1))[index]


def pf_ppo_filter(
    scores: torch.Tensor,
    uids: Sequence[str],
    mode: str,
    k: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """PF-PPO's policy filtration within each group: scores (B,) -> keep (B,) bool.

    Each group is ranked by score, best first, ties to the lower index. ``best_k``: the first ``k`` of
    the ranking; ``best_and_worst``: the first and the last (``k`` is ignored; a group of one keeps its
    sample); ``random``: ``k`` samples drawn uniformly without replacement from ``generator``. A ``k``
    at least the group's size keeps the whole group.
    """
    if mode not in PF_PPO_MODES:
        raise ValueError(f"unknown pf_ppo mode {mode!r}; allowed: {', '.join(PF_PPO_MODES)}")
    if mode != "best_and_worst" and k < 1:
        raise ValueError(f"pf_ppo k must be >= 1, got {k}")
    values = scores.tolist()
    keep = torch.zeros(len(values), dtype=torch.bool)
    for members in _groups(uids):
        if mode == "random":
            picks = torch.randperm(len(members), generator=generator)[:k].tolist()
            chosen = [members[p] for p in picks]
        else:
            ranked = sorted(members, key=lambda i: (-values[i], i))
            chosen = ranked[:k] if mode == "best_k" else [ranked[0], ranked[-1]]
        keep[chosen] = True
    return keep.to(scores.device)


def group_win_rates(scores: torch.Tensor, uids: Sequence[str]) -> torch.Tensor:
    """SPPO's win rates: scores (B,) -> P (B,) float.

    ``P_i`` is the mean over the other samples j of i's group of 1 if ``s_i > s_j``, 0.5 if equal,
    0 if less; a group of one gets 0.5.
    """
    rates = torch.full(scores.shape, 0.5, dtype=torch.float32, device=scores.device)
    for members in _groups(uids):
        if len(members) < 2:
            continue
        idx = torch.tensor(members, device=scores.device)
        s = scores[idx]
        # the diagonal compares a sample with itself (0.5); take it back out of the sum
        wins = (s[:, None] > s[None, :]).float() + 0.5 * (s[:, None] == s[None, :]).float()
        rates[idx] = (wins.sum(-1) - 0.5) / (len(members) - 1)
    return rates
