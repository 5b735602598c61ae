"""Reductions over the valid (unmasked) entries of (B, R) tensors; the algorithms pass the policy's tokens
(:func:`mmrl.trajectory.policy_mask`) as the mask."""

from __future__ import annotations

import torch


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
