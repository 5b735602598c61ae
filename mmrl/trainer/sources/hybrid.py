"""The sync mode's rollout source (``trainer.mode=sync``): the hybrid engine, the actor's own workers generating
with the weights the trainer just updated."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mmrl.protocol import Batch
from mmrl.rollout.sampling import SamplingParams
from mmrl.trainer.sources.base import Generate, RolloutSource


class HybridRollouts(RolloutSource):
    """Samples from the rollout engine colocated with the actor; the engine gets the actor's weights at the start
    of each step (when its copy is behind or was freed) and after each update."""

    holds_engine = True

    def begin_step(self) -> int:
        return self.sync_weights(wake=True)

    def sync_weights(self, wake: bool) -> int:
        """The ``update_weights`` stage: the actor's weights into the rollout engine, if its version changed
        (into a freed engine only with ``wake``). Returns 1 when they moved, else 0."""
        with self.timer("update_weights"):
            return self.workers.sync_weights(wake)[0]

    def samples(self, prompts: Batch, params: SamplingParams) -> Batch:
        with self.timer("gen"):
            return self.generate(prompts, params)

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        return prompts.repeat(params.n).union(self.workers.generate(prompts, params,
                                                                     share_contexts=self.share_contexts))

    def release(self) -> None:
        self.workers.release_engine()

    def phase_seconds(self) -> dict[str, float]:
        per_rank = self.workers.rollout_seconds()
        return {f"gen/{name}": max(r.get(name, 0.0) for r in per_rank) for name in {n for r in per_rank for n in r}}

    def after_update(self) -> int:
        return self.sync_weights(wake=False)

    @contextmanager
    def serving(self) -> Iterator[Generate]:
        self.sync_weights(wake=True)
        yield self.workers.generate_once
        self.workers.release_engine()
