"""DAPO (Yu et al., 2025): GRPO with dynamic sampling. Groups whose rewards all agree carry no advantage, so
they are dropped and more prompts are generated until the step's batch is full (at most
``algorithm.max_gen_rounds`` rounds). The rest of DAPO is configuration (configs/algos/dapo.yaml): clip-higher
(``actor.clip_ratio_high``), the token-level loss (``actor.loss_agg_mode=token-mean``) and overlong reward
shaping (the ``overlong_penalty`` reward in ``reward.weights``)."""

from __future__ import annotations

from typing import ClassVar

from mmrl.algos.base import Algorithm, RolloutContext, keep_rows
from mmrl.algos.filters import mixed_groups
from mmrl.algos.grpo import GRPO
from mmrl.protocol import Batch


class DynamicSampling(Algorithm):
    """Keeps the groups whose rewards differ, and samples more rounds of fresh prompts until as many groups as
    the step was given prompts are kept (DAPO's dynamic sampling; VAPO takes it too)."""

    min_group_size: ClassVar[int] = 2
    config_keys: ClassVar[tuple[str, ...]] = ("algorithm.max_gen_rounds",)

    def filter(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Keep the groups whose rewards differ (a group of one is kept)."""
        batch.require("token_level_rewards", "uid")
        return keep_rows(batch, mixed_groups(batch["token_level_rewards"].sum(-1), batch["uid"]))

    def collect(self, ctx: RolloutContext, prompts: Batch) -> tuple[Batch, dict[str, float]]:
        """Rounds of :meth:`sample` and :meth:`filter` until ``len(prompts)`` groups are kept, then the first
        that many. The reward and filter metrics are the first round's; ``filter/gen_rounds`` counts the rounds.
        Raises RuntimeError after ``algorithm.max_gen_rounds`` rounds that kept too few."""
        batch, metrics = self.sample(ctx, prompts)
        batch, filter_metrics = self.filter(batch)
        want, limit = len(prompts), self.cfg.max_gen_rounds
        kept, rounds = [batch], 1
        while (groups := len({uid for part in kept for uid in part["uid"]})) < want:
            if rounds >= limit:
                raise RuntimeError(
                    f"dynamic sampling: after {rounds} generation rounds only {groups} of {want} prompts had "
                    f"responses whose rewards differ (algorithm.max_gen_rounds={limit}); raise "
                    "algorithm.max_gen_rounds, rollout.n or rollout.temperature, or train with grpo")
            more = ctx.next_prompts()
            more.objects["uid"] = [f"{uid}#{rounds}" for uid in more["uid"]]  # a prompt drawn twice is two groups
            more, _ = self.sample(ctx, more)
            more, _ = self.filter(more)
            kept.append(more)
            rounds += 1
        batch = first_groups(Batch.concat(kept), want)
        return batch, metrics | filter_metrics | {"filter/gen_rounds": float(rounds)}


class DAPO(DynamicSampling, GRPO):
    """GRPO's group advantages on the groups dynamic sampling keeps."""


def first_groups(batch: Batch, count: int) -> Batch:
    """The samples of the first ``count`` groups (by ``uid``, in order of appearance)."""
    chosen: set[str] = set()
    rows = []
    for row, uid in enumerate(batch["uid"]):
        if uid not in chosen and len(chosen) < count:
            chosen.add(uid)
        if uid in chosen:
            rows.append(row)
    return batch.select(rows)
