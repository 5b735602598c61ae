"""What an RL algorithm is to the driver: declarations, hooks, an advantage computation, an optional filter.

The driver and the config checks read only these declarations and call only these hooks; nothing outside
``mmrl/algos/`` branches on an algorithm's name or reads a setting that one algorithm owns.

A step, as the driver runs it::

    batch, metrics = algorithm.collect(ctx, prompts)   # sample (+ extra rollouts), filter, maybe more rounds
    ... old / reference log-probs, values ...
    batch = batch.union(algorithm.compute_advantages(batch))
    ... critic update; the actor update when algorithm.trains_actor(step), with the algorithm's
    policy loss and extra losses, on the common fields plus algorithm.loss_fields
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from mmrl import trajectory
from mmrl.algos.losses import LOSSES
from mmrl.protocol import Batch

if TYPE_CHECKING:
    from mmrl.rollout.sampling import SamplingParams


@dataclass(frozen=True)
class RolloutContext:
    """What the trainer lends an algorithm's collection hooks for one step."""

    sampling: SamplingParams
    """The run's sampling: ``rollout.n`` responses per prompt at the rollout temperature."""
    sample: Callable[[Batch], tuple[Batch, dict[str, float]]]
    """prompts -> (one row per sample, ``sampling.n`` per prompt in prompt order, scored as :attr:`score` does;
    the reward metrics). Timed as the step's ``gen`` and ``reward`` stages."""
    generate: Callable[[Batch, SamplingParams], Batch]
    """(prompts, params) -> ``params.n`` rows per prompt: the prompt's fields and the generated ones
    (``responses``, ``response_mask``, ...). Not timed: a hook that calls it times itself with :attr:`timer`."""
    score: Callable[[Batch], tuple[Batch, dict[str, float]]]
    """samples -> (the same rows with ``token_level_rewards`` (B, R) and ``correct`` (B,), the reward metrics)."""
    next_prompts: Callable[[], Batch]
    """A fresh batch of prompts from the loader (``trainer.prompts_per_step`` of them, with new uids)."""
    timer: Callable[[str], AbstractContextManager[None]]
    """``with timer(stage):`` adds the block's seconds to the step's ``timing_s/<stage>``."""


class Algorithm:
    """Base of every algorithm. A subclass sets the declarations below and implements
    :meth:`compute_advantages`; it may override :meth:`filter` and the hooks."""

    needs_critic: ClassVar[bool] = False
    """A value model is trained beside the policy and ``values`` are computed before the advantages."""
    min_group_size: ClassVar[int] = 1
    """The smallest ``rollout.n`` it works with (group baselines compare the responses of one prompt)."""
    policy_loss: ClassVar[str] = "ppo_clip"
    """The default policy loss, a policy loss of :data:`mmrl.algos.losses.LOSSES` (``actor.loss.policy``
    overrides it)."""
    extra_losses: ClassVar[tuple[str, ...]] = ()
    """The losses the actor's update adds to the policy loss: extra losses of :data:`mmrl.algos.losses.LOSSES`,
    each weighted by its section's coefficient ``actor.loss.<name>.coef`` (0 leaves it out)."""
    loss_fields: ClassVar[tuple[str, ...]] = ()
    """The per-sample batch fields it computes for its losses, beyond the common ones (prompt, responses,
    response_mask, advantages, old and reference log-probs): what they read (each loss spec's ``fields``). The
    ``update_actor`` dispatch ships them."""
    config_keys: ClassVar[tuple[str, ...]] = ()
    """The dotted keys of the common ``algorithm`` section this class reads (keys several algorithms share, such
    as ``algorithm.gamma``); with its bases' and its extra losses' keys they are the keys it owns
    (:meth:`owned_keys`). A key some algorithm owns is refused under the others."""
    section: ClassVar[type | None] = None
    """Its own keys, the ones no other algorithm reads: a dataclass of bounded fields, one docstring each, which
    :mod:`mmrl.config` gathers from :data:`mmrl.algos.ALGORITHMS` as ``algorithm.<its name>``. None: it has none.
    The section is refused under another algorithm."""

    def __init__(self, cfg: Any) -> None:
        """``cfg``: the run's ``algorithm`` section (:class:`mmrl.config.AlgorithmConfig`): the common keys, and
        each algorithm's own section as ``cfg.<its name>``."""
        self.cfg = cfg

    def compute_advantages(self, batch: Batch) -> Batch:
        """Scored samples -> a Batch with ``advantages`` (B, R), zero at holes and padding, plus any other
        targets the updates need (``returns`` for a critic, the :attr:`loss_fields` its losses read)."""
        raise NotImplementedError

    def filter(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Run after scoring, before the log-prob passes: the samples to keep, and metrics. Keeps all."""
        return batch, {}

    @classmethod
    def owned_keys(cls) -> tuple[str, ...]:
        """The common keys of this class and of every base along its MRO, and its extra losses' section keys
        (its own section's keys are ``algorithm.<its name>.*``: :func:`mmrl.algos.key_owners`)."""
        keys = [key for klass in reversed(cls.__mro__) for key in vars(klass).get("config_keys", ())]
        extra = (key for name in cls.extra_losses for key in LOSSES[name].section_keys())
        return tuple(dict.fromkeys([*keys, *extra]))

    @classmethod
    def check(cls, cfg: Any) -> None:
        """Raise a :class:`~mmrl.config_fields.ConfigError` naming the keys and the fix when the run's config
        (:class:`mmrl.config.Config`) asks what this algorithm cannot do; run at load by
        :mod:`mmrl.algos.checks`, beside the checks every algorithm gets (group size, loss, critic). Checks
        nothing."""

    # ---- hooks --------------------------------------------------------------------------------

    def collect(self, ctx: RolloutContext, prompts: Batch) -> tuple[Batch, dict[str, float]]:
        """The step's training samples and the metrics of collecting them: one round of :meth:`sample`, then
        :meth:`filter`."""
        batch, metrics = self.sample(ctx, prompts)
        batch, filter_metrics = self.filter(batch)
        return batch, metrics | filter_metrics

    def sample(self, ctx: RolloutContext, prompts: Batch) -> tuple[Batch, dict[str, float]]:
        """``rollout.n`` scored responses to each prompt, with what :meth:`extra_rollouts` adds."""
        batch, metrics = ctx.sample(prompts)
        return self.extra_rollouts(ctx, prompts, batch), metrics

    def extra_rollouts(self, ctx: RolloutContext, prompts: Batch, batch: Batch) -> Batch:
        """More generation the advantages need beside the samples (ReMax's greedy baseline): ``batch`` (the
        scored samples of ``prompts``) with the fields it adds. Adds none."""
        return batch

    def trains_actor(self, step: int) -> bool:
        """Whether this step updates the actor (the critic, if any, is always updated); ``step`` counts the
        steps finished before it (0 in the first). Always."""
        return True


class WithCritic(Algorithm):
    """An algorithm that trains a value model beside the policy; its first ``algorithm.critic_warmup_steps``
    steps train the critic alone (value pre-training: the actor waits for useful values)."""

    needs_critic: ClassVar[bool] = True
    config_keys: ClassVar[tuple[str, ...]] = ("algorithm.critic_warmup_steps",)

    def trains_actor(self, step: int) -> bool:
        """From step ``algorithm.critic_warmup_steps`` on (0-based)."""
        return step >= self.cfg.critic_warmup_steps


def keep_rows(batch: Batch, keep: torch.Tensor) -> tuple[Batch, dict[str, float]]:
    """A filter's result: the rows where ``keep`` (B,) bool is set, and the kept and dropped counts."""
    kept = batch.select(keep.nonzero().squeeze(-1))
    return kept, {"filter/kept_samples": float(keep.sum()), "filter/dropped_samples": float((~keep).sum())}


class OutcomeAlgorithm(Algorithm):
    """An algorithm whose advantage is one number per response, broadcast over its policy tokens."""

    def compute_advantages(self, batch: Batch) -> Batch:
        batch.require("token_level_rewards", "response_mask", "uid")
        mask = trajectory.policy_mask(batch)
        scores = batch["token_level_rewards"].sum(-1)
        per_sample = self.outcome_advantages(scores, batch["uid"])
        return Batch(tensors={"advantages": per_sample.unsqueeze(-1) * mask})

    def outcome_advantages(self, scores: torch.Tensor, uids: Sequence[str]) -> torch.Tensor:
        """scores (B,) and the B group ids -> advantages (B,)."""
        raise NotImplementedError
