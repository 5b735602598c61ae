"""Trajectories with holes: which response tokens the policy sampled.

A response may hold tokens the policy did not sample (a tool's output, an environment's turn). Two masks,
each (B, R) float32, describe a response:

- ``response_mask``, the attention extent: 1 on every response token, holes included, 0 on right padding.
  The forward sees every token of it as context, and a token budget counts it.
- ``policy_mask``, the policy's own tokens: a subset of ``response_mask``, 0 at holes and padding. Every
  per-token computation (log-probs, entropy, KL, losses, advantages, returns, whitening, metrics) counts only
  these; without a ``policy_mask`` field every response token is the policy's.

Advantages and returns run over the policy's tokens as if the holes were not there: :func:`close_holes`
moves each row's policy tokens to the front, in order, a recursion runs over that prefix, and
:func:`open_holes` puts its results back in place (0 at holes and padding). With no holes the prefix is the
row itself, so the recursion does exactly the arithmetic it did before holes existed.
"""

from __future__ import annotations

import torch

from mmrl.protocol import Batch


def policy_mask(batch: Batch) -> torch.Tensor:
    """(B, R): the batch's ``policy_mask`` when it has one, else its ``response_mask`` (no holes).

    Raises ValueError when the ``policy_mask`` is not a subset of the ``response_mask``.
    """
    if "policy_mask" not in batch.tensors:
        batch.require("response_mask")
        return batch["response_mask"]
    policy, extent = batch["policy_mask"], batch.tensors.get("response_mask")
    if extent is not None and (policy.shape != extent.shape or bool(((policy > 0) & (extent <= 0)).any())):
        raise ValueError(f"policy_mask {tuple(policy.shape)} must lie within response_mask {tuple(extent.shape)}: "
                         "1 only on response tokens the policy sampled, 0 at holes and padding (rows a dispatcher "
                         "pads must have both zeroed)")
    return policy


def last_policy_token(policy_mask: torch.Tensor) -> torch.Tensor:
    """policy_mask (B, R) -> (B,) long: where each row's last policy token is (0 in a row without any)."""
    positions = torch.arange(policy_mask.shape[-1], device=policy_mask.device).expand_as(policy_mask)
    return torch.where(policy_mask > 0, positions, -1).amax(-1).clamp(min=0)


def place_on_last_token(scores: torch.Tensor, policy_mask: torch.Tensor) -> torch.Tensor:
    """scores (B,), policy_mask (B, R) -> (B, R) float32: each score on its row's last policy token, 0
    elsewhere (the outcome reward goes where the policy last acted, not on a tool's output after it)."""
    out = torch.zeros(policy_mask.shape, dtype=torch.float32, device=policy_mask.device)
    out[torch.arange(len(scores), device=out.device), last_policy_token(policy_mask)] = scores.to(out)
    return out


def close_holes(values: torch.Tensor, policy_mask: torch.Tensor) -> torch.Tensor:
    """values, policy_mask (B, R) -> (B, R): row i's values at its policy tokens, in order, then zeros.

    Values at holes and padding are dropped (even non-finite ones). The policy tokens of row i fill the
    prefix of length ``policy_mask[i].sum()``; :func:`open_holes` undoes it.
    """
    on = policy_mask > 0
    # A stable sort of "not the policy's" puts each row's policy positions first, in their order.
    order = torch.sort((~on).to(torch.uint8), dim=-1, stable=True).indices
    gathered = values.gather(-1, order)
    return torch.where(prefix_mask(policy_mask), gathered, torch.zeros_like(gathered))


def open_holes(closed: torch.Tensor, policy_mask: torch.Tensor) -> torch.Tensor:
    """closed (B, R), in :func:`close_holes`'s order, -> (B, R) back in place: 0 at holes and padding."""
    on = policy_mask > 0
    slot = (on.long().cumsum(-1) - 1).clamp(min=0)  # each policy token's place in the closed prefix
    gathered = closed.gather(-1, slot)
    return torch.where(on, gathered, torch.zeros_like(gathered))


def prefix_mask(policy_mask: torch.Tensor) -> torch.Tensor:
    """policy_mask (B, R) -> bool (B, R): True on the first ``policy_mask[i].sum()`` positions of row i."""
    counts = (policy_mask > 0).sum(-1, keepdim=True)
    return torch.arange(policy_mask.shape[-1], device=policy_mask.device) < counts
