"""What an RL algorithm is to the driver: declarations, an advantage computation, an optional filter.

The driver and the config validation read only these declarations; nothing outside ``mmrl/algos/``
branches on an algorithm's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import torch

from mmrl import trajectory
from mmrl.config import AlgorithmConfig
from mmrl.protocol import Batch

RewardLevel = Literal["outcome", "token"]


class Algorithm:
    """Base of every algorithm. A subclass sets the declarations below and implements
    :meth:`compute_advantages`; it may override :meth:`filter`."""

    needs_critic: ClassVar[bool] = False
    """A value model is trained beside the policy and ``values`` are computed before the advantages."""
    needs_reference: ClassVar[bool] = False
    """The reference policy's log-probs are needed even without a KL loss (``actor.use_kl_loss`` loads it anyway)."""
    min_group_size: ClassVar[int] = 1
    """The smallest ``rollout.n`` it works with (group baselines compare the responses of one prompt)."""
    reward_level: ClassVar[RewardLevel] = "outcome"
    """``outcome``: one scalar per response (the sum of its token rewards); ``token``: per-token rewards."""
    policy_loss: ClassVar[str] = "ppo_clip"
    """The default policy loss, a key of :data:`mmrl.algos.losses.POLICY_LOSSES` (``actor.policy_loss`` overrides it)."""
    dynamic_sampling: ClassVar[bool] = False
    """:meth:`filter` drops whole groups, and the trainer generates more rounds (up to
    ``algorithm.max_gen_rounds``) until ``trainer.prompts_per_step`` groups are kept (DAPO)."""
    greedy_baseline: ClassVar[bool] = False
    """The advantages need ``baseline_scores`` (B,): the reward of a greedy response to the same prompt (ReMax)."""

    def __init__(self, cfg: AlgorithmConfig) -> None:
        self.cfg = cfg

    def compute_advantages(self, batch: Batch) -> Batch:
        """Scored samples -> a Batch with ``advantages`` (B, R), zero at holes and padding, plus any other
        targets the updates need (``returns`` for a critic)."""
        raise NotImplementedError

    def filter(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Run after scoring, before the log-prob passes: the samples to keep, and metrics. Keeps all."""
        return batch, {}


def keep_rows(batch: Batch, keep: torch.Tensor) -> tuple[Batch, dict[str, float]]:
    """A filter's result: the rows where ``keep`` (B,) bool is set, and the kept and dropped counts."""
    kept = batch.select(keep.nonzero().squeeze(-1))
    return kept, {"filter/kept_samples": float(keep.sum()), "filter/dropped_samples": float((~keep).sum())}


class OutcomeAlgorithm(Algorithm):
    """An algorithm whose advantage is one number per response, broadcast over its policy tokens."""

    reward_level: ClassVar[RewardLevel] = "outcome"

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("token_level_rewards", "response_mask", "uid")
        mask = trajectory.policy_mask(batch)
        scores = batch["token_level_rewards"].sum(-1)
        per_sample = self.outcome_advantages(scores, batch["uid"])
        return Batch(tensors={"advantages": per_sample.unsqueeze(-1) * mask})

    def outcome_advantages(self, scores: torch.Tensor, uids: Sequence[str]) -> torch.Tensor:
        """scores (B,) and the B group ids -> advantages (B,)."""
        raise NotImplementedError
