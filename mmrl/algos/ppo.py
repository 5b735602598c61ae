"""PPO with a learned critic (Schulman et al., 2017): per-token advantages by generalised advantage
estimation (GAE) over the critic's values, whitened over the batch; the critic regresses the returns."""

from __future__ import annotations

import torch

from mmrl.algos.base import WithCritic
from mmrl.algos.masked import masked_whiten
from mmrl.protocol import Batch


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


class PPO(WithCritic):
    config_keys = ("algorithm.gamma", "algorithm.lam")

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("token_level_rewards", "values", "response_mask")
        advantages, returns = gae_advantages(
            batch["token_level_rewards"], batch["values"], batch["response_mask"], self.cfg.gamma, self.cfg.lam
        )
        return Batch(tensors={"advantages": advantages, "returns": returns})
