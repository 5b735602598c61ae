"""PF-PPO, policy filtration (Zhang et al., 2024): PPO with a critic whose update sees only part of each
group of sampled responses, chosen by reward before the update (``algorithm.filter_mode``: best_k, the k best;
best_and_worst; random, k at random; ``algorithm.filter_k``). Filtering out responses whose reward is least
reliable improves the signal the policy learns from."""

from __future__ import annotations

import torch

from mmrl.algos.base import keep_rows
from mmrl.algos.filters import pf_ppo_filter
from mmrl.algos.ppo import PPO
from mmrl.protocol import Batch


class PFPPO(PPO):
    min_group_size = 2
    config_keys = ("algorithm.filter_mode", "algorithm.filter_k")

    def filter(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        batch.require("token_level_rewards", "uid")
        generator = torch.Generator().manual_seed(len(batch))
        keep = pf_ppo_filter(batch["token_level_rewards"].sum(-1), batch["uid"], self.cfg.filter_mode,
                             self.cfg.filter_k, generator=generator)
        return keep_rows(batch, keep)
