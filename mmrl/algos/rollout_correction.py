"""Off-policy correction for samples the rollout engine drew with other weights than the trainer's.

Three policies meet in an update on off-policy samples (decoupled PPO, as in AReaL and verl's rollout
correction): the behaviour policy ``mu`` that sampled the tokens (the engine's ``rollout_log_probs``, possibly
some weight versions old in async mode), the proximal policy ``pi_old`` (the trainer's weights before this
update: the recomputed ``old_log_probs``) and the policy being trained ``pi``. PPO's ratio ``pi / pi_old`` keeps
the update near ``pi_old``; the truncated importance weight ``min(pi_old / mu, cap)`` corrects for the tokens
having been drawn from ``mu``, and is held constant (no gradient).

Modes (``actor.rollout_correction``):

- ``none``: no weight (the ratio alone; what a synchronous run does, whose ``mu`` and ``pi_old`` agree within
  the engines' 1e-4);
- ``token``: one weight per token, ``min(exp(old_t - rollout_t), cap)`` (truncated IS, TIS);
- ``sequence``: one weight per sequence, ``min(exp(sum_t old_t - rollout_t), cap)`` over its policy tokens,
  on each of them.

The weight multiplies each token's policy-gradient term. The losses that take it are those whose spec says
``linear`` (:data:`mmrl.algos.losses.LOSSES`: ``ppo_clip``, ``dual_clip``, ``gspo``, ``cispo``, ``sapo``, ``gpg``,
``dppo_tv``, ``dppo_kl``; not GMPO's per-sequence term nor the covariance losses, whose token choice reads the
advantages): linear in the advantage for a positive factor (``max(-wA r, -wA clip(r)) = w max(-A r, -A clip(r))``
for ``w > 0``, and the same for the dual-clip cap), so the updater applies it as ``A * w``; the KL and entropy
terms are not weighted.
"""

from __future__ import annotations

import math

import torch

MODES = ("none", "token", "sequence")
IS_WEIGHTS = "rollout_is_weights"
"""The batch field of the weights (B, R)."""


def rollout_is_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor,
                       mode: str, cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """old_log_probs, rollout_log_probs, mask (B, R) -> weights (B, R) (1 where ``mask`` is 0) and metrics.

    Metrics (over the policy's tokens for ``token``, over sequences with a policy token for ``sequence``; none
    when there are none): ``rollout_is_mean``, ``rollout_is_max``, ``rollout_is_min`` (of the truncated weights),
    ``rollout_is_truncated`` (the share cut to ``cap``) and ``rollout_is_log_ratio_max`` (the largest
    untruncated ``|log weight|``: how far the behaviour policy drifted).
    """
    if mode not in MODES[1:]:
        raise ValueError(f"actor.rollout_correction={mode!r}: weights are computed for token or sequence")
    if not cap >= 1:
        raise ValueError(f"actor.rollout_is_cap={cap} must be >= 1 (the weights of on-policy tokens are 1)")
    valid = mask.bool()
    log_cap = math.log(cap)
    log_ratio = (old_log_probs - rollout_log_probs).float() * valid
    if mode == "sequence":
        per_seq = log_ratio.sum(-1)
        log_w = per_seq[valid.any(-1)]
        weights = torch.exp(per_seq.clamp(max=log_cap)).unsqueeze(-1).expand_as(log_ratio)
    else:
        log_w = log_ratio[valid]
        weights = torch.exp(log_ratio.clamp(max=log_cap))
    weights = torch.where(valid, weights, torch.ones_like(weights)).to(old_log_probs.dtype)
    if log_w.numel() == 0:
        return weights, {}
    kept = torch.exp(log_w.clamp(max=log_cap))
    metrics = {
        "rollout_is_mean": float(kept.mean()),
        "rollout_is_max": float(kept.max()),
        "rollout_is_min": float(kept.min()),
        "rollout_is_truncated": float((log_w > log_cap).float().mean()),
        "rollout_is_log_ratio_max": float(log_w.abs().max()),
    }
    return weights, metrics
