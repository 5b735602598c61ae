"""SPPO, self-play preference optimisation (Wu et al., 2024): the sequence log-ratio of the policy to the
previous one is pushed towards ``eta * (P(y wins) - 1/2)`` by a square loss (policy loss ``sppo``). The win
rate of a response is estimated within its group, against the other responses to the same prompt, from the
reward (a reward model's scores when ``reward.model.path`` is set, the rules' otherwise). The loss reads the
win rates (``win_rates`` (B,)); the advantages, the win rate minus one half on every token, feed the metrics."""

from __future__ import annotations

from mmrl import trajectory
from mmrl.algos.base import Algorithm
from mmrl.algos.filters import group_win_rates
from mmrl.protocol import Batch


class SPPO(Algorithm):
    min_group_size = 2
    policy_loss = "sppo"
    loss_fields = ("win_rates",)

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("token_level_rewards", "response_mask", "uid")
        mask = trajectory.policy_mask(batch)
        rates = group_win_rates(batch["token_level_rewards"].sum(-1), batch["uid"])
        return Batch(tensors={"advantages": (rates - 0.5).unsqueeze(-1) * mask, "win_rates": rates})
