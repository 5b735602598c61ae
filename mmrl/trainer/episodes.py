"""What one sample is, as the trainer sees it: a single response, or an agent episode (``rollout.agent``).

The ranks that generate decide how to run an episode (:mod:`mmrl.agent.rollout`); the trainer only needs the few
things below from the kind, so that its step reads no ``rollout.agent.enabled``. :func:`episode_kind` picks the
run's kind.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from mmrl.agent.rollout import agent_metrics
from mmrl.config import Config
from mmrl.controller import WorkerGroup
from mmrl.protocol import Batch
from mmrl.trainer.traces import log_traces

GuideRunner = Callable[[Batch], Batch]


class SingleTurn:
    """One response per sample, at most ``rollout.max_new_tokens`` long."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    @property
    def longest(self) -> int:
        """The most response tokens a sample can hold (what the reward stage budgets for)."""
        return self.cfg.rollout.max_new_tokens

    def tool_names(self, group: WorkerGroup) -> list[str]:
        """The tools the episodes of ``group``'s ranks can call."""
        return []

    def shares_contexts(self, groups: Collection[str]) -> bool:
        """Whether the samples' scoring contexts go back to the driver, given the names of the groups beside the
        actor's: a single response has none beyond its prompt."""
        return False

    def guide_runner(self, run: GuideRunner) -> GuideRunner | None:
        """What runs a guide of ``trainer.guide_unsolved`` (:class:`~mmrl.trainer.guidance.Guidance`): None, a
        single-turn guide is encoded on the driver."""
        return None

    def metrics(self, batch: Batch, tools: list[str]) -> dict[str, float]:
        """The step's metrics of its samples' kind."""
        return {}

    def trace(self, batch: Batch, step: int) -> int:
        """``tracking.trace_episodes`` of the step's scored samples as MLflow traces of the active run
        (:mod:`mmrl.trainer.traces`): a single response is a trace of one span, an episode (whose record the batch
        holds) has a span per turn and tool call besides. Returns how many were logged."""
        return log_traces(batch, step, self.cfg.tracking.trace_episodes) if self.cfg.tracking.trace_episodes else 0


class AgentEpisodes(SingleTurn):
    """A multi-turn episode with tools, at most ``rollout.agent.max_tokens`` long over all its turns."""

    @property
    def longest(self) -> int:
        return self.cfg.rollout.agent.max_tokens

    def tool_names(self, group: WorkerGroup) -> list[str]:
        return group.tool_names()

    def shares_contexts(self, groups: Collection[str]) -> bool:
        """An episode's scoring context (its tool turns' media) goes back when another group scores the samples too
        (a critic's or a reward model's ranks; the judge reads the episode's record)."""
        return bool({"critic", "reward_model"} & set(groups))

    def guide_runner(self, run: GuideRunner) -> GuideRunner | None:
        """``run``: the guide episodes run through the real tools by the ranks that hold their prompts."""
        return run

    def metrics(self, batch: Batch, tools: list[str]) -> dict[str, float]:
        return agent_metrics(batch, tools)


def episode_kind(cfg: Config) -> SingleTurn:
    """The run's kind of sample."""
    return (AgentEpisodes if cfg.rollout.agent.enabled else SingleTurn)(cfg)
