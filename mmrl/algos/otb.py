"""OTB, the optimal token baseline (verl's ``optimal_token_baseline``, its docs/algo/otb.md; arXiv:2602.07078): a
baseline per token position and group, the group's returns-to-go weighted by how much gradient energy each
response has gathered up to that token, so that responses on uncertain paths set the baseline more.

B samples, R response positions, ``m`` the policy mask (B, R); for sample i of a group and position t:

    G_t = sum_{t' >= t} r_t' m_t'                      the return-to-go (undiscounted)
    w_t = (1 - 2 pi_t + sum_v pi_v(t)^2) rho_t^2       the squared norm of d log pi(y_t) / d logits (its
                                                       logit-gradient energy), times the squared truncated
                                                       importance weight rho_t of the rollout correction (1
                                                       without it)
    W_t = sum_{j <= t} w_j m_j                         the energy gathered up to t
    B_t = sum_i G_t W_t m_t / (sum_i W_t m_t + eps)    over the group's samples, the same for all of them
    A_t = (G_t - B_t) m_t

A group of one gets ``B = 0`` (its advantage is its return). ``pi_t`` is the probability of the sampled token;
``sum_v pi_v(t)^2`` is over the vocabulary.

How it departs from verl: mmrl's scoring passes give the sampled token's log-prob only, not the full
``sum_v pi_v^2``, so :class:`OTB` takes that sum's sampled-token share, ``pi_t^2``: ``w_t = (1 - pi_t)^2``. As
``sum_{v != y_t} pi_v^2 <= (1 - pi_t)^2``, this is at most a factor 2 below verl's energy at each token (equal when
the other tokens' mass is spread thin). :func:`otb_advantages` takes any ``sum_pi_squared``. ``pi_t`` comes from
the old log-probs when the step has them, else from the engine's (the same weights, within 1e-4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from mmrl import trajectory
from mmrl.algos.base import Algorithm
from mmrl.algos.groups import group_index
from mmrl.algos.rollout_correction import IS_WEIGHTS
from mmrl.config_fields import num
from mmrl.protocol import Batch


@dataclass(kw_only=True)
class OTBConfig:
    """OTB, the optimal token baseline (``algorithm.name=otb``)."""

    epsilon: float = num(1e-8, gt=0)
    """Added to the group's gathered energy before dividing by it (verl's)."""
    zero_tail: bool = False
    """A group's longest response, when no other is as long, gets no baseline on its tokens past the second
    longest's length (verl's ``handle_zero_tail``, off in its estimator)."""


def token_energy(log_probs: torch.Tensor, sum_pi_squared: torch.Tensor) -> torch.Tensor:
    """log_probs (B, R) of the sampled tokens, sum_pi_squared (B, R) over the vocabulary -> ``1 - 2 pi + sum pi^2``
    (B, R): the squared norm of the gradient of the sampled token's log-prob with respect to the logits."""
    return 1 - 2 * log_probs.exp() + sum_pi_squared


@torch.no_grad()
def otb_advantages(
    token_rewards: torch.Tensor,
    policy_mask: torch.Tensor,
    uids: Sequence[str],
    log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    *,
    is_weights: torch.Tensor | None = None,
    epsilon: float = 1e-8,
    zero_tail: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """token_rewards, policy_mask, log_probs, sum_pi_squared, is_weights (B, R) and the B group ids ->
    (advantages ``A``, returns ``G``), each (B, R) and 0 where the mask is 0: the formula of the module docstring.

    With ``zero_tail``, a response is as long as the position after its last policy token; a group whose longest
    response is longer than every other gets ``B = 0`` on that response's positions from the second longest's
    length on.
    """
    mask = policy_mask.to(token_rewards.dtype)
    returns = (token_rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask
    energy = token_energy(log_probs, sum_pi_squared).to(mask.dtype)
    if is_weights is not None:
        energy = energy * is_weights.square()
    gathered = (energy * mask).cumsum(-1) * mask
    positions = torch.arange(1, mask.shape[-1] + 1, dtype=mask.dtype)
    lengths = (mask * positions).amax(-1).long()
    index, groups = group_index(uids)
    baselines = torch.zeros_like(returns)
    for g in range(groups):
        members = (index == g).nonzero().squeeze(-1)
        if len(members) < 2:
            continue
        weights = gathered[members]
        baselines[members] = (returns[members] * weights).sum(0) / (weights.sum(0) + epsilon)
        if zero_tail:
            longest, second = lengths[members].sort(descending=True).values[:2].tolist()
            if longest > second:
                baselines[members[lengths[members] == longest], second:] = 0.0
    return (returns - baselines) * mask, returns


class OTB(Algorithm):
    """verl's optimal token baseline on the sampled token's share of the logit-gradient energy (the module
    docstring); the rollout correction's weights, when on, scale the energy too."""

    min_group_size: ClassVar[int] = 2
    section: ClassVar[type | None] = OTBConfig

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("token_level_rewards", "response_mask", "uid")
        source = "old_log_probs" if "old_log_probs" in batch.tensors else "rollout_log_probs"
        batch.require(source)
        log_probs = batch[source]
        own: OTBConfig = self.cfg.otb
        advantages, returns = otb_advantages(
            batch["token_level_rewards"], trajectory.policy_mask(batch), batch["uid"], log_probs,
            log_probs.exp().square(), is_weights=batch.tensors.get(IS_WEIGHTS), epsilon=own.epsilon,
            zero_tail=own.zero_tail)
        return Batch(tensors={"advantages": advantages, "returns": returns})
