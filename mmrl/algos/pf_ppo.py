"""PF-PPO, policy filtration (Zhang et al., 2024): PPO with a critic whose update sees only part of each
group of sampled responses, chosen by reward before the update (``algorithm.pf_ppo.filter_mode``: best_k, the k
best; best_and_worst; random, k at random; ``algorithm.pf_ppo.filter_k``). Filtering out responses whose reward is
least reliable improves the signal the policy learns from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from mmrl.algos.base import keep_rows
from mmrl.algos.filters import pf_ppo_filter
from mmrl.algos.ppo import PPO
from mmrl.config_fields import num
from mmrl.protocol import Batch


@dataclass(kw_only=True)
class PFPPOConfig:
    """PF-PPO (``algorithm.name=pf_ppo``): the responses of each group the update keeps."""

    filter_mode: Literal["best_k", "best_and_worst", "random"] = "best_k"
    """Which responses of each group the update keeps."""
    filter_k: int = num(4, ge=1)
    """Responses kept per group (best_k, random)."""


class PFPPO(PPO):
    min_group_size = 2
    section = PFPPOConfig

    def filter(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        batch.require("token_level_rewards", "uid")
        generator = torch.Generator().manual_seed(len(batch))
        own: PFPPOConfig = self.cfg.pf_ppo
        keep = pf_ppo_filter(batch["token_level_rewards"].sum(-1), batch["uid"], own.filter_mode, own.filter_k,
                             generator=generator)
        return keep_rows(batch, keep)
