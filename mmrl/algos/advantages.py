"""Advantage estimators.

Outcome estimators give one scalar reward per response, broadcast over its tokens: each maps
``scores (B,)`` and group ids to advantages ``(B,)``; :func:`compute_advantages` broadcasts them onto the
response tokens. :func:`gae_advantages` (PPO with a critic) works per token and needs value estimates, so
it is called directly rather than registered in ``ESTIMATORS``.
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


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the entries where ``mask`` is set; (B, R), (B, R) -> scalar (0 if none)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Whiten ``values`` with the mean and unbiased variance of the valid entries; (B, R) -> (B, R).

    ``(x - mean) / sqrt(var + eps)``; with ``shift_mean=False`` the mean is added back afterwards (only
    the scale changes). Padding (mask 0) comes out as 0. With fewer than two valid entries the variance
    is taken as 0.
    """
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = masked_mean(values, mask)
    var = ((values - mean).square() * mask).sum() / (count - 1).clamp(min=1)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


@torch.no_grad()
def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over right-padded responses.

    token_rewards, values, response_mask: (B, R); the mask is 1 on a prefix of each row. The episode
    ends at the last valid token (the value after it is 0); rewards and values at padding are ignored.
    ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``, ``returns = A + V``.
    Returns ``(advantages, returns)``, each (B, R) and 0 on padding; the advantages are whitened over
    all valid tokens of the batch, the returns are not. No gradient flows through either.
    """
    mask = response_mask.to(values.dtype)
    rewards = token_rewards * mask
    values = values * mask
    length = values.shape[-1]
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = (delta + gamma * lam * next_adv) * mask[:, t]
        next_value = values[:, t]
        advantages[:, t] = next_adv
    returns = (advantages + values) * mask
    return masked_whiten(advantages, mask), returns
