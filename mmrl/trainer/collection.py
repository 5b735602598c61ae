"""How a step collects its batch: the algorithm's collection hook over the run's rollout source and reward stage,
with the scoring stages the config chose.

The algorithm decides the rounds (:meth:`mmrl.algos.base.Algorithm.collect`: one round and its filter, dynamic
sampling's further rounds, extra rollouts); the rollout source decides where samples come from
(:mod:`mmrl.trainer.sources`); the kind of sample, what it is (:mod:`mmrl.trainer.episodes`); the scoring stages
rewrite a scored batch (``trainer.guide_unsolved``'s guides, :mod:`mmrl.trainer.guidance`). None of them is a
flag the trainer's step reads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

import torch

from mmrl.algos import Algorithm, RolloutContext
from mmrl.config import Config
from mmrl.protocol import Batch
from mmrl.rollout.sampling import SamplingParams
from mmrl.trainer.episodes import GuideRunner, SingleTurn
from mmrl.trainer.guidance import Guidance
from mmrl.trainer.pass_rates import PassRates
from mmrl.trainer.reward_stage import RewardStage
from mmrl.trainer.sft import response_ids
from mmrl.trainer.sources import RolloutSource
from mmrl.trajectory import place_on_last_token, policy_mask

Scores = Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]


class ScoreStage(Protocol):
    def apply(self, batch: Batch, scores: torch.Tensor, correct: torch.Tensor, score: Scores
              ) -> tuple[Batch, torch.Tensor, torch.Tensor, dict[str, float]]:
        """A scored batch of B samples and its (scores, correct), each (B,) -> the batch rewritten, its scores and
        verdicts to match, the stage's metrics. ``score(rows)`` scores K new samples: (scores (K,), correct (K,))."""
        ...


class Collection:
    """One step's collection (see the module docstring). ``stages`` rewrite each scored batch, in order."""

    def __init__(self, algorithm: Algorithm, source: RolloutSource, reward: RewardStage, stages: list[ScoreStage],
                 params: SamplingParams, timer: Callable[[str], AbstractContextManager[None]]) -> None:
        self.algorithm, self.source, self.reward, self.stages = algorithm, source, reward, stages
        self.params, self.timer = params, timer

    def collect(self, prompts: Batch, next_prompts: Callable[[], Batch], pass_rates: PassRates
                ) -> tuple[Batch, dict[str, float]]:
        """The step's samples and the metrics of collecting them; the policy's own verdicts go into ``pass_rates``.
        ``next_prompts`` draws a fresh batch of prompts (for an algorithm's further rounds)."""
        self.pass_rates = pass_rates
        ctx = RolloutContext(sampling=self.params, sample=self.sample, generate=self.source.generate,
                             score=self.score, next_prompts=next_prompts, timer=self.timer)
        return self.algorithm.collect(ctx, prompts)

    def sample(self, prompts: Batch) -> tuple[Batch, dict[str, float]]:
        """``rollout.n`` responses to each prompt from the source, scored; the reward metrics."""
        batch = self.source.samples(prompts, self.params)
        with self.timer("reward"):
            return self.score(batch)

    def score(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """The reward stage's scores as ``token_level_rewards`` (on each response's last policy token), the
        verifier's ``correct``, and the reward metrics (``train/acc`` among them), after the scoring stages."""
        out = self.reward.score(batch)
        self.pass_rates.record(batch["uid"], out.correct)  # the policy's own samples
        scores, correct, metrics = out.scores, out.correct, out.metrics
        for stage in self.stages:
            batch, scores, correct, stage_metrics = stage.apply(batch, scores, correct, self.score_rows)
            metrics = metrics | stage_metrics
        batch.tensors["token_level_rewards"] = place_on_last_token(scores, policy_mask(batch))
        batch.tensors["correct"] = correct
        return batch, metrics

    def score_rows(self, rows: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The reward stage's (scores, correct), each (K,), of K samples (a stage's new ones)."""
        out = self.reward.score(rows)
        return out.scores, out.correct


def score_stages(cfg: Config, tokenizer: object, episodes: SingleTurn, run_guides: GuideRunner) -> list[ScoreStage]:
    """The scoring stages the config asks for: ``trainer.guide_unsolved``'s guidance (its guides encoded on the
    driver, or run as episodes by ``run_guides``), or none."""
    if not cfg.trainer.guide_unsolved:
        return []
    return [Guidance(functools.partial(response_ids, tokenizer), episodes.guide_runner(run_guides))]
