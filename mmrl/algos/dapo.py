"""DAPO (Yu et al., 2025): GRPO with dynamic sampling. Groups whose rewards all agree carry no advantage, so
they are dropped and more prompts are generated until the step's batch is full (at most
``algorithm.max_gen_rounds`` rounds). The rest of DAPO is configuration (configs/dapo.yaml): clip-higher
(``actor.clip_ratio_high``), the token-level loss (``actor.loss_agg_mode=token-mean``) and overlong reward
shaping (the ``overlong_penalty`` reward in ``reward.weights``)."""

from __future__ import annotations

from mmrl.algos.base import keep_rows
from mmrl.algos.filters import mixed_groups
from mmrl.algos.grpo import GRPO
from mmrl.protocol import Batch


class DAPO(GRPO):
    dynamic_sampling = True

    def filter(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Keep the groups whose rewards differ (a group of one is kept)."""
        batch.require("token_level_rewards", "uid")
        return keep_rows(batch, mixed_groups(batch["token_level_rewards"].sum(-1), batch["uid"]))
