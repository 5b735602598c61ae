"""Aggregating per-token loss values over a batch (``actor.loss_agg_mode``), in verl's names.

- ``token-mean``: sum over all valid tokens / number of valid tokens;
- ``seq-mean-token-sum``: per-sequence token sums, averaged over sequences;
- ``seq-mean-token-mean``: per-sequence token means, averaged over sequences;
- ``seq-mean-token-sum-norm`` (Dr. GRPO): per-sequence token sums, averaged over sequences and divided by
  a constant ``horizon`` (the maximum response length), so that no sequence's length scales its tokens.
"""

from __future__ import annotations

import torch


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    denominator: float | None = None,
    horizon: float | None = None,
) -> torch.Tensor:
    """values, mask (B, R) -> scalar.

    ``denominator`` replaces the local count (valid tokens for token-mean, sequences otherwise), so that
    partial sums over micro-batches and ranks add up to the global mean. ``horizon`` is the constant
    normaliser of ``seq-mean-token-sum-norm`` (default ``R = mask.shape[-1]``; pass the maximum response
    length so that micro-batches padded to different widths agree); the other modes ignore it.
    """
    if mode == "token-mean":
        count = denominator if denominator is not None else mask.sum().clamp(min=1)
        return (values * mask).sum() / count
    if mode == "seq-mean-token-sum":
        per_seq = (values * mask).sum(-1)
    elif mode == "seq-mean-token-mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        horizon = mask.shape[-1] if horizon is None else horizon
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        per_seq = (values * mask).sum(-1) / horizon
    else:
        raise ValueError(
            f"unknown loss_agg_mode {mode!r}; allowed: token-mean, seq-mean-token-sum, seq-mean-token-mean, "
            "seq-mean-token-sum-norm"
        )
    count = denominator if denominator is not None else per_seq.shape[0]
    return per_seq.sum() / count
