"""The seam between the trainer and where its samples come from.

A :class:`RolloutSource` is handed to :class:`~mmrl.trainer.rl.RLTrainer`; the trainer's step is the same for
every source. What a source decides: whether the actor's workers hold the rollout engine, which prompts a step
trains on, how their samples are drawn (and with which weights), what happens to the weights after an update,
what generates for validation, and what a checkpoint records of the loader. The table of sources is
:data:`mmrl.trainer.sources.SOURCES` (``trainer.mode`` picks one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from mmrl.controller import WorkerGroup
from mmrl.controller.session import worker_shape
from mmrl.protocol import Batch
from mmrl.rollout.sampling import SamplingParams

if TYPE_CHECKING:
    from mmrl.config import Config, ResourcesConfig
    from mmrl.trainer.dataset import PromptLoader

Timer = Callable[[str], AbstractContextManager[None]]
Generate = Callable[[Batch, SamplingParams], Batch]


class RolloutSource:
    """Base of the rollout sources: the defaults are those of a source without a pool of its own."""

    holds_engine: bool = True
    """Whether the actor's workers hold the rollout engine (built with ``with_rollout``)."""

    def __init__(self, cfg: Config, checkpoint: str, params: SamplingParams) -> None:
        """``cfg``: the run's resolved config; ``checkpoint``: the policy's starting weights; ``params``: the run's
        sampling (``rollout.n`` responses per prompt)."""
        self.cfg, self.checkpoint, self.params = cfg, checkpoint, params

    def worker_shape(self, resources: ResourcesConfig, use_gpu: bool, pools: int) -> tuple[float, int]:
        """(CPUs per bundle, torch threads per worker) of the trainer's ``pools`` pools."""
        return worker_shape(resources, use_gpu, pools=pools)

    def build(self, workers: WorkerGroup, share_contexts: bool, timer: Timer) -> None:
        """Called once the trainer's groups are built (again after a recovery): the actor's group, whether agent
        episodes' scoring contexts go back to the driver, and the trainer's step timer."""
        self.workers, self.share_contexts, self.timer = workers, share_contexts, timer

    @property
    def episode_group(self) -> WorkerGroup:
        """The group whose ranks run the rollouts (and an agent's tools)."""
        return self.workers

    def reset(self) -> None:
        """Back to step 0 (a new run, or a recovery)."""

    def next_prompts(self, loader: PromptLoader) -> Batch:
        """The prompts of the next step."""
        return loader.next_batch()

    def begin_step(self) -> int:
        """Called as a step starts; returns the weight syncs it made (0 or 1)."""
        return 0

    def samples(self, prompts: Batch, params: SamplingParams) -> Batch:
        """``params.n`` samples of each prompt, one row per sample with its prompt's fields, timed by the source."""
        raise NotImplementedError

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Samples drawn now with the trainer's current weights (an algorithm's extra rollouts, or its next round of
        prompts); untimed."""
        raise NotImplementedError(f"{type(self).__name__} draws no samples inside a step")

    def release(self) -> None:
        """Called once the step's samples are collected (the engine's memory may go)."""

    def after_update(self) -> int:
        """Called after the step's updates; returns the weight syncs it made (0 or 1)."""
        return 0

    @contextmanager
    def serving(self) -> Iterator[Generate]:
        """``with source.serving() as generate:`` a generation function for validation, with the current weights."""
        raise NotImplementedError
        yield

    def loader_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """What a checkpoint records of the loader, given its state now."""
        return state

    def restored(self) -> None:
        """Called after the trainer loaded a checkpoint."""

    def metrics(self) -> dict[str, float]:
        """The source's metrics of the step just trained."""
        return {}

    def phase_seconds(self) -> dict[str, float]:
        """The step's generation seconds per phase its engines timed (``gen/vision``, ``gen/prefill``,
        ``gen/decode``: the slowest rank's), for the MFU account; empty where none were timed."""
        return {}

    def shutdown(self) -> None:
        """Stop what the source started (not the trainer's groups)."""
