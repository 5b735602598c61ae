"""VAPO (Yue et al., 2025) advantage pieces: length-adaptive GAE and decoupled GAE for actor and critic.

The critic learns from low-bias (lambda close to 1) returns, while the actor's lambda grows with the
response length, so that long responses are not dominated by the critic's bias nor short ones by variance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from mmrl import trajectory
from mmrl.algos.base import WithCritic
from mmrl.algos.dapo import DynamicSampling
from mmrl.algos.masked import masked_whiten
from mmrl.algos.ppo import gae
from mmrl.config_fields import num
from mmrl.protocol import Batch


@dataclass(kw_only=True)
class VAPOConfig:
    """VAPO (``algorithm.name=vapo``): the lambdas of its decoupled GAE."""

    lam_critic: float = num(1.0, ge=0, le=1)
    """GAE lambda of the critic's targets (decoupled from the actor's)."""
    lam_alpha: float = num(0.05, gt=0)
    """The actor's length-adaptive lambda, ``1 - 1 / (lam_alpha * response length)``."""


def length_adaptive_lambda(lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    """Response lengths (B,) -> lambda (B,) float, ``1 - 1 / (alpha * length)`` clamped to [0, 1].

    A length of 0 is taken as 1.
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    return (1 - 1 / (alpha * lengths.clamp(min=1).float())).clamp(0.0, 1.0)


@torch.no_grad()
def decoupled_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    policy_mask: torch.Tensor,
    gamma: float,
    lam_critic: float,
    lam_actor: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """token_rewards, values, policy_mask (B, R), lam_actor (B,) -> (advantages, returns), each (B, R).

    returns: :func:`~mmrl.algos.ppo.gae` with ``lam_critic`` (the critic's targets, not whitened);
    advantages: GAE with row i's ``lam_actor[i]``, whitened over the policy's tokens of the batch. Both run
    over the policy's tokens only and are 0 at holes and padding.
    """
    mask = policy_mask.to(values.dtype)
    critic_lam = torch.full(values.shape[:1], lam_critic, dtype=values.dtype, device=values.device)
    _, returns = gae(token_rewards, values, mask, gamma, critic_lam)
    actor_adv, _ = gae(token_rewards, values, mask, gamma, lam_actor)
    return masked_whiten(actor_adv, mask), returns


class VAPO(WithCritic, DynamicSampling):
    """VAPO (Yue et al., 2025): value-based PPO with DAPO's pieces. A critic (warmed up alone for
    ``algorithm.critic_warmup_steps``), decoupled GAE (the critic's targets with ``algorithm.vapo.lam_critic``,
    the actor's advantages with a length-adaptive lambda, ``algorithm.vapo.lam_alpha``), and from DAPO dynamic
    sampling, clip-higher, the token-level loss and overlong shaping; plus the positive-example LM loss
    (``actor.loss.positive_lm.coef``, on the samples the verifier accepts). configs/algos/vapo.yaml sets them."""

    config_keys: ClassVar[tuple[str, ...]] = ("algorithm.gamma",)
    section: ClassVar[type | None] = VAPOConfig
    extra_losses: ClassVar[tuple[str, ...]] = ("positive_lm",)
    loss_fields: ClassVar[tuple[str, ...]] = ("correct",)

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("token_level_rewards", "values", "response_mask")
        mask = trajectory.policy_mask(batch)
        own: VAPOConfig = self.cfg.vapo
        lam_actor = length_adaptive_lambda(mask.sum(-1), own.lam_alpha)
        advantages, returns = decoupled_gae(batch["token_level_rewards"], batch["values"], mask, self.cfg.gamma,
                                            own.lam_critic, lam_actor)
        return Batch(tensors={"advantages": advantages, "returns": returns})
