"""VAPO (Yue et al., 2025) advantage pieces: length-adaptive GAE and decoupled GAE for actor and critic.

The critic learns from low-bias (lambda close to 1) returns, while the actor's lambda grows with the
response length, so that long responses are not dominated by the critic's bias nor short ones by variance.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from mmrl.algos.base import WithCritic
from mmrl.algos.dapo import DynamicSampling
from mmrl.algos.masked import masked_whiten
from mmrl.protocol import Batch


def length_adaptive_lambda(lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    """Response lengths (B,) -> lambda (B,) float, ``1 - 1 / (alpha * length)`` clamped to [0, 1].

    A length of 0 is taken as 1.
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    return (1 - 1 / (alpha * lengths.clamp(min=1).float())).clamp(0.0, 1.0)


@torch.no_grad()
def gae_per_row_lambda(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: torch.Tensor,
) -> torch.Tensor:
    """GAE, one lambda per row: token_rewards, values, response_mask (B, R), lam (B,) -> advantages (B, R).

    As :func:`mmrl.algos.ppo.gae_advantages` (the value after the last valid token is 0; rewards and
    values at padding are ignored), but not whitened. 0 on padding; no gradient.
    """
    mask = response_mask.to(values.dtype)
    rewards = torch.where(mask > 0, token_rewards, torch.zeros_like(token_rewards)).to(values.dtype)
    values = torch.where(mask > 0, values, torch.zeros_like(values))
    lam = lam.to(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[-1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = (delta + gamma * lam * next_adv) * mask[:, t]
        next_value = values[:, t]
        advantages[:, t] = next_adv
    return advantages


@torch.no_grad()
def decoupled_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam_critic: float,
    lam_actor: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """token_rewards, values, response_mask (B, R), lam_actor (B,) -> (advantages, returns), each (B, R).

    returns: GAE with ``lam_critic`` plus the values (the critic's targets, not whitened); advantages:
    GAE with row i's ``lam_actor[i]``, whitened over all valid tokens of the batch. Both 0 on padding.
    """
    mask = response_mask.to(values.dtype)
    critic_lam = torch.full(values.shape[:1], lam_critic, dtype=values.dtype, device=values.device)
    critic_adv = gae_per_row_lambda(token_rewards, values, mask, gamma, critic_lam)
    returns = torch.where(mask > 0, critic_adv + values, torch.zeros_like(values))
    actor_adv = gae_per_row_lambda(token_rewards, values, mask, gamma, lam_actor)
    return masked_whiten(actor_adv, mask), returns


class VAPO(WithCritic, DynamicSampling):
    """VAPO (Yue et al., 2025): value-based PPO with DAPO's pieces. A critic (warmed up alone for
    ``algorithm.critic_warmup_steps``), decoupled GAE (the critic's targets with ``algorithm.lam_critic``, the
    actor's advantages with a length-adaptive lambda, ``algorithm.lam_alpha``), and from DAPO dynamic
    sampling, clip-higher, the token-level loss and overlong shaping; plus the positive-example LM loss
    (``actor.positive_lm_coef``, on the samples the verifier accepts). configs/algos/vapo.yaml sets them."""

    config_keys: ClassVar[tuple[str, ...]] = ("algorithm.gamma", "algorithm.lam_critic", "algorithm.lam_alpha")
    extra_losses: ClassVar[dict[str, str]] = {"positive_lm": "actor.positive_lm_coef"}
    loss_fields: ClassVar[tuple[str, ...]] = ("correct",)

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("token_level_rewards", "values", "response_mask")
        mask = batch["response_mask"]
        lam_actor = length_adaptive_lambda(mask.sum(-1), self.cfg.lam_alpha)
        advantages, returns = decoupled_gae(batch["token_level_rewards"], batch["values"], mask, self.cfg.gamma,
                                            self.cfg.lam_critic, lam_actor)
        return Batch(tensors={"advantages": advantages, "returns": returns})
