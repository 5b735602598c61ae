"""The algorithms' hooks, run through a RolloutContext of plain functions over Batches: the default collection,
DAPO's dynamic sampling (and VAPO's, inherited), ReMax's greedy baseline, the critic warm-up. The real
generation and rewards run in tests/integration/test_algorithm_family.py."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import pytest
import torch

from mmrl.algos import RolloutContext, build_algorithm
from mmrl.config import load_config
from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams

SAMPLING = SamplingParams(n=2, temperature=0.7, top_p=0.9, max_new_tokens=3)


def prompts(*kinds: str, tag: str = "") -> Batch:
    """One prompt per kind: ``flat`` prompts get equal rewards for all their samples, ``mixed`` ones 0, 1, ..."""
    return Batch(objects={"uid": [f"{kind}{i}{tag}" for i, kind in enumerate(kinds)], "answer": list(kinds)})


@dataclass
class Recorder:
    """A RolloutContext's functions, keeping what they were called with."""

    more: list[Batch] = field(default_factory=list)
    calls: list[tuple[int, SamplingParams]] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)

    def generate(self, prompt_rows: Batch, params: SamplingParams) -> Batch:
        self.calls.append((len(prompt_rows), params))
        rows = prompt_rows.repeat(params.n)
        rows.tensors["response_mask"] = torch.ones(len(rows), 2)
        rows.tensors["sample_no"] = torch.arange(params.n).repeat(len(prompt_rows))
        rows.tensors["greedy"] = torch.full((len(rows),), float(params.greedy))
        return rows

    def score(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Reward: the sample's number on mixed prompts, 0.5 on flat ones; 10 more for a greedy sample."""
        mixed = torch.tensor([a == "mixed" for a in batch["answer"]])
        score = torch.where(mixed, batch["sample_no"].float(), torch.full((len(batch),), 0.5)) + 10 * batch["greedy"]
        rewards = torch.zeros(len(batch), 2)
        rewards[:, -1] = score
        batch.tensors["token_level_rewards"] = rewards
        return batch, {"critic/score/mean": float(score.mean())}

    def sample(self, prompt_rows: Batch) -> tuple[Batch, dict[str, float]]:
        return self.score(self.generate(prompt_rows, SAMPLING))

    @contextlib.contextmanager
    def timer(self, stage: str):
        self.stages.append(stage)
        yield

    def context(self) -> RolloutContext:
        return RolloutContext(sampling=SAMPLING, sample=self.sample, generate=self.generate, score=self.score,
                              next_prompts=lambda: self.more.pop(0), timer=self.timer)


def algorithm(name: str, *overrides: str):
    return build_algorithm(load_config(None, [f"algorithm.name={name}", *overrides]))


def test_the_default_collection_samples_once_and_applies_the_filter():
    rec = Recorder()
    batch, metrics = algorithm("grpo").collect(rec.context(), prompts("flat", "mixed"))
    assert batch["uid"] == ["flat0", "flat0", "mixed1", "mixed1"]
    assert rec.calls == [(2, SAMPLING)] and metrics == {"critic/score/mean": 0.5}
    batch, metrics = algorithm("pf_ppo", "algorithm.pf_ppo.filter_k=1").collect(Recorder().context(), prompts("mixed"))
    assert batch["sample_no"].tolist() == [1] and metrics["filter/kept_samples"] == 1.0


@pytest.mark.parametrize("name", ["dapo", "vapo"])
def test_dynamic_sampling_draws_fresh_prompts_until_the_step_is_full(name):
    """Round 1 keeps 1 of 3 groups, round 2 two more (as new groups: their uids get #1): the first 3 groups
    make the step; the reward and filter metrics are round 1's."""
    rec = Recorder(more=[prompts("flat", "mixed", "mixed", tag="r2")])
    batch, metrics = algorithm(name).collect(rec.context(), prompts("flat", "mixed", "flat"))
    assert batch["uid"] == ["mixed1", "mixed1", "mixed1r2#1", "mixed1r2#1", "mixed2r2#1", "mixed2r2#1"]
    assert [params for _, params in rec.calls] == [SAMPLING, SAMPLING]
    assert metrics == {"critic/score/mean": 0.5, "filter/kept_samples": 2.0,
                       "filter/dropped_samples": 4.0, "filter/gen_rounds": 2.0}


def test_dynamic_sampling_stops_after_max_gen_rounds_and_says_what_to_change():
    rec = Recorder(more=[prompts("flat", "mixed", tag="r2"), prompts("flat", "flat", tag="r3")])
    with pytest.raises(RuntimeError, match=r"after 2 generation rounds only 1 of 2 prompts .* "
                                           r"\(algorithm.max_gen_rounds=2\); raise algorithm.max_gen_rounds"):
        algorithm("dapo", "algorithm.max_gen_rounds=2").collect(rec.context(), prompts("flat", "flat"))
    assert len(rec.more) == 1  # the second round drew one fresh batch


def test_remax_scores_one_greedy_response_per_prompt_as_the_baseline():
    rec = Recorder()
    batch, _ = algorithm("remax").collect(rec.context(), prompts("mixed", "flat"))
    greedy = SamplingParams(n=1, temperature=0.7, top_p=0.9, max_new_tokens=3, greedy=True)
    assert rec.calls == [(2, SAMPLING), (2, greedy)] and rec.stages == ["baseline"]
    # the greedy response of "mixed" is its sample 0 (score 0 + 10), of "flat" 0.5 + 10; one per sample
    assert batch["baseline_scores"].tolist() == [10.0, 10.0, 10.5, 10.5]
    adv = algorithm("remax").compute_advantages(batch)["advantages"]
    assert adv[:, 0].tolist() == pytest.approx([-10.0, -9.0, -10.0, -10.0])


def test_only_the_critic_algorithms_hold_the_actor_back_during_the_critic_warm_up():
    vapo = algorithm("vapo", "algorithm.critic_warmup_steps=2")
    assert [vapo.trains_actor(step) for step in range(4)] == [False, False, True, True]
    assert algorithm("ppo", "algorithm.critic_warmup_steps=1").trains_actor(0) is False
    assert all(algorithm(name).trains_actor(0) for name in ("grpo", "ppo", "remax", "dapo", "rloo"))
