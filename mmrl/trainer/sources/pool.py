"""The async mode's rollout source (``trainer.mode=async``): a rollout pool generates the next batches while the
trainer updates.

The source keeps a queue of batches in flight on the rollout pool (:class:`RolloutWorker` ranks, their own
placement: ``rollout.num_workers``). A step takes the oldest, waits for it if it is not done
(``timing_s/wait_rollout``); the trainer scores it and trains on it exactly as on the hybrid engine's samples: the
old log-probs are recomputed by the trainer (the proximal policy), the engine's own are the behaviour policy's
(``actor.rollout_correction``). After the update the trainer's weights are published
(:mod:`mmrl.trainer.weight_transport`) and the queue is topped up with the next prompts.

**Staleness.** A batch's samples are drawn with the newest weights published when the batch *starts*
(:class:`~mmrl.workers.rollout_worker.RolloutWorker` loads them between batches; with ``rollout.partial`` also
between the tokens of a batch, each token recording its version, and a sample's ``weight_version`` is then its
first token's, its oldest, so the bound below holds for every token). Its staleness is the trainer's version when it is trained on
minus the version that drew it. With ``trainer.stale_policy=wait`` at most ``max_staleness + 1`` batches are in
flight; a batch was submitted after the update ``max_staleness`` versions before the one it is trained at, so
no sample is ever older than ``max_staleness`` and none is wasted, and ``max_staleness=0`` is the sync run
(the same prompts, the same seeded draws, the same weights). With ``drop`` one more batch is in flight, so the
pool does not wait for the trainer's weights, and a batch that arrives older than ``max_staleness`` is
dropped (``async/dropped_groups`` counts its groups; its prompts are skipped, as a filter would skip them).

**Resume.** A checkpoint records the loader as it was before the oldest untrained batch was drawn: a resumed
run draws the in-flight prompts again and generates them with its current weights (the buffer is regenerated,
not saved).

**A failed rollout rank.** A rank that dies, or hangs (a stopped or stuck process: alive, silent), costs the pool's
unfinished batches, never the trainer's steps: the pool is rebuilt, its new ranks load the newest weights from the
transport, and every batch in flight that has not come back is submitted again (finished ones are kept). A batch's
deadline (``trainer.step_timeout_s``) counts from when the driver starts to wait for it, and the ranks run their
calls in order, so the batch waited for is the one running: a hung rank is caught about ``step_timeout_s`` after the
trainer begins to wait, however many batches are queued behind it. Regenerated samples record the version that drew
them, the newest published, so they are no staler than the first draw would have been and the staleness bound holds;
a step trains one whole batch, never part of one. The old ranks are killed (``ray.kill`` ends a stopped process too,
within seconds) and the old placement group removed before the new pool asks for its own. Evaluation
(:meth:`PoolRollouts.serving`) first waits for the batches in flight, so that its calls have the pool to itself and
their own deadlines, and a failure during it rebuilds the pool in the same way and makes the call again. A second
failure of the same batch or call, or of the rebuilt pool's start, goes to the trainer's recovery (from its newest
checkpoint), as the trainer's own failures do.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mmrl.controller import ResourcePool, WorkerFailure, WorkerGroup
from mmrl.controller.session import worker_shape
from mmrl.controller.worker import resolve_device
from mmrl.controller.worker_group import Pending
from mmrl.protocol import Batch
from mmrl.rollout.sampling import SamplingParams
from mmrl.trainer.sources.base import Generate, RolloutSource, Timer
from mmrl.trainer.weight_transport import build_transport
from mmrl.trajectory import policy_mask
from mmrl.workers.rollout_worker import RolloutWorker

if TYPE_CHECKING:
    from mmrl.config import ResourcesConfig
    from mmrl.trainer.dataset import PromptLoader


@dataclass
class InFlight:
    """A batch submitted to the rollout pool: its prompts, the loader's state before they were drawn, the call, and
    its samples once collected."""

    prompts: Batch
    loader_state: dict[str, Any]
    pending: Pending
    samples: Batch | None = None


class PoolRollouts(RolloutSource):
    """Samples from a rollout pool that runs ahead of the trainer by up to ``trainer.max_staleness`` versions."""

    holds_engine = False
    worker: type = RolloutWorker
    """The pool's worker class (a test may put a probed subclass here)."""

    def reset(self) -> None:
        self.inflight: deque[InFlight] = deque()
        self.trainer_version = 0
        self.to_publish = True  # the trainer's weights are not published yet
        self.rollout_restarts = 0
        self.step_metrics: dict[str, float] = {}

    @property
    def depth(self) -> int:
        """Batches in flight: ``max_staleness + 1`` (wait), one more (drop)."""
        trainer = self.cfg.trainer
        return trainer.max_staleness + 1 + (trainer.stale_policy == "drop")

    # ---- set-up -------------------------------------------------------------------------------

    def worker_shape(self, resources: ResourcesConfig, use_gpu: bool, pools: int) -> tuple[float, int]:
        """The trainer's pools and the rollout pool run at once: the CPUs are split over all their bundles."""
        self.shape = worker_shape(resources, use_gpu, pools, others=self.cfg.rollout.num_workers)
        return self.shape

    def build(self, workers: WorkerGroup, share_contexts: bool, timer: Timer) -> None:
        """The weight transport and the rollout pool, beside the trainer's groups."""
        super().build(workers, share_contexts, timer)
        self.transport = build_transport(self.cfg.rollout.weight_transport)
        self.build_pool()

    def build_pool(self) -> None:
        cfg, res = self.cfg, self.cfg.resources
        use_gpu = resolve_device(res.device).type == "cuda"
        cpus, threads = self.shape
        pool = ResourcePool(cfg.rollout.num_workers, cpus, use_gpu, name="rollout", reuse=res.reuse_workers)
        self.pool = WorkerGroup(self.worker, pool, threads=threads, device=res.device,
                                timeout_s=cfg.trainer.step_timeout_s)
        self.pool.init_model(cfg, self.checkpoint, self.transport)

    @property
    def episode_group(self) -> WorkerGroup:
        return self.pool  # the pool's ranks run the tools

    def restored(self) -> None:
        self.to_publish = True

    # ---- the queue ----------------------------------------------------------------------------

    def fill(self) -> None:
        """Submit prompts until ``depth`` batches are in flight (each generation call starts once the pool's
        earlier ones are done, with the newest weights then published)."""
        if self.to_publish:
            self.publish()
        while len(self.inflight) < self.depth:
            state = copy.deepcopy(self.loader.state_dict())
            prompts = self.loader.next_batch()
            pending = self.pool.submit("generate", prompts, self.params)
            self.inflight.append(InFlight(prompts, state, pending))

    def next_prompts(self, loader: PromptLoader) -> Batch:
        self.loader = loader
        self.fill()
        return self.inflight[0].prompts

    def begin_step(self) -> int:
        self.step_metrics = {}
        return 0

    def samples(self, prompts: Batch, params: SamplingParams) -> Batch:
        """The oldest batch in flight (``prompts``'), waited for (the hybrid engine's ``gen`` is this source's
        ``wait_rollout``); a batch older than ``max_staleness`` is dropped (``drop``) and the next one taken, with the
        queue topped up."""
        dropped = 0
        while True:
            with self.timer("wait_rollout"):
                samples = self.take()
            head = self.inflight.popleft()
            staleness = self.trainer_version - samples["weight_version"]
            if int(staleness.max()) <= self.cfg.trainer.max_staleness:
                break
            dropped += len(head.prompts)
            self.fill()
            prompts = self.inflight[0].prompts
        self.step_metrics = {
            "async/staleness_mean": float(staleness.float().mean()), "async/staleness_max": float(staleness.max()),
            "async/dropped_groups": float(dropped), "async/buffer_batches": float(len(self.inflight)),
            "timing_s/wait_weights": float(samples["rollout_wait_s"].max()),
        } | self.token_metrics(samples)
        samples.tensors.pop("rollout_wait_s")
        return prompts.repeat(params.n).union(samples)

    def token_metrics(self, samples: Batch) -> dict[str, float]:
        """With in-flight updates (``token_versions``): the staleness of the policy's own tokens (mean; tool turns are
        holes) and the share of them drawn by newer weights than their sample's first token."""
        if "token_versions" not in samples.tensors:
            return {}
        mask = policy_mask(samples) > 0
        versions = samples["token_versions"][mask]
        count = max(int(mask.sum()), 1)
        newer = (samples["token_versions"] > samples["weight_version"][:, None])[mask]
        return {"async/token_staleness_mean": float((self.trainer_version - versions).sum()) / count,
                "async/inflight_token_share": float(newer.sum()) / count}

    def take(self) -> Batch:
        """The head batch's samples (see :meth:`collected`)."""
        return self.collected(self.inflight[0])

    def collected(self, item: InFlight) -> Batch:
        """``item``'s samples, waited for (the deadline counted from now); a failed rollout pool is rebuilt, the
        unfinished batches in flight are submitted again, and ``item`` is waited for once more."""
        if item.samples is None:
            try:
                item.samples = item.pending.result()
            except WorkerFailure as failure:
                self.restart_pool(failure)
                item.samples = item.pending.result()
        return item.samples

    def settle(self) -> None:
        """Wait for every batch in flight, oldest first, each under its own deadline."""
        for item in self.inflight:
            self.collected(item)

    def restart_pool(self, failure: WorkerFailure) -> None:
        """Replace the pool (its ranks killed, its placement removed) and submit the unfinished batches again."""
        again = [item for item in self.inflight if item.samples is None]
        print(f"rollout pool failed ({failure}); rebuilding it and generating the {len(again)} unfinished batches "
              "in flight again", flush=True)
        self.pool.shutdown()
        self.build_pool()
        self.rollout_restarts += 1
        for item in again:
            item.pending = self.pool.submit("generate", item.prompts, self.params)

    # ---- the weights --------------------------------------------------------------------------

    def after_update(self) -> int:
        """Publish the trainer's weights and top the queue up: the next batches start on them."""
        with self.timer("update_weights"):
            moved = self.publish()
        self.fill()
        return moved

    def publish(self) -> int:
        """Gather the trainer's weights and send them through the transport (a collective on its ranks); 1 when the
        published version changed (or none from this trainer was published yet), else 0."""
        version = self.workers.publish_weights(self.transport)
        moved = int(version != self.trainer_version or self.to_publish)
        self.trainer_version, self.to_publish = version, False
        return moved

    @contextmanager
    def serving(self) -> Iterator[Generate]:
        """Evaluation on the rollout pool, with the newest published weights (the trainer has no engine), once the
        batches in flight are back: each evaluation call then has the pool to itself, and its own deadline."""
        self.settle()
        yield self.serve

    def serve(self, prompts: Batch, params: SamplingParams) -> Batch:
        """The pool's ``generate``; a failed pool is rebuilt (the batches in flight generated again first) and the
        call made once more."""
        try:
            return self.pool.generate(prompts, params)
        except WorkerFailure as failure:
            self.restart_pool(failure)
            self.settle()
            return self.pool.generate(prompts, params)

    def loader_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The loader as it was before the oldest untrained batch was drawn: a resumed run draws it again."""
        return self.inflight[0].loader_state if self.inflight else state

    def metrics(self) -> dict[str, float]:
        return self.step_metrics | {"async/rollout_restarts": float(self.rollout_restarts)}

    def shutdown(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.shutdown()
        self.pool = None
        self.inflight = deque()
