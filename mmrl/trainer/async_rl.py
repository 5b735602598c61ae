"""The async mode (``trainer.mode=async``): a rollout pool generates the next batches while the trainer updates.

The driver keeps a queue of batches in flight on the rollout pool (:class:`RolloutWorker` ranks, their own
placement: ``rollout.num_workers``). A step takes the oldest, waits for it if it is not done
(``timing_s/wait_rollout``), scores it and trains on it exactly as the sync step does: the old log-probs are
recomputed by the trainer (the proximal policy), the engine's own are the behaviour policy's
(``actor.rollout_correction``). After the update the trainer publishes its weights (:mod:`mmrl.trainer.weight_transport`) and
the driver tops the queue up with the next prompts.

**Staleness.** A batch's samples are drawn with the newest weights published when the batch *starts*
(:class:`~mmrl.workers.rollout_worker.RolloutWorker` loads them between batches, never inside one: in-flight
samples finish on the weights they started with). Its staleness is the trainer's version when it is trained on
minus the version that drew it. With ``trainer.stale_policy=wait`` at most ``max_staleness + 1`` batches are in
flight; a batch was submitted after the update ``max_staleness`` versions before the one it is trained at, so
no sample is ever older than ``max_staleness`` and none is wasted, and ``max_staleness=0`` is the sync run
(the same prompts, the same seeded draws, the same weights). With ``drop`` one more batch is in flight, so the
pool does not wait for the trainer's weights, and a batch that arrives older than ``max_staleness`` is
dropped (``async/dropped_groups`` counts its groups; its prompts are skipped, as a filter would skip them).

**Resume.** A checkpoint records the loader as it was before the oldest untrained batch was drawn: a resumed
run draws the in-flight prompts again and generates them with its current weights (the buffer is regenerated,
not saved). A rollout rank that dies or hangs costs its batches: the pool is rebuilt, it loads the newest
weights from the transport, and the batches in flight are submitted again; the trainer's failures take the sync
mode's recovery.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrl.controller import ResourcePool, WorkerFailure, WorkerGroup
from mmrl.controller.session import worker_shape
from mmrl.controller.worker import resolve_device
from mmrl.controller.worker_group import Pending
from mmrl.protocol import Batch
from mmrl.trainer.checkpoint import DriverState
from mmrl.trainer.evaluation import EvalResult, evaluate, samples_html, samples_table
from mmrl.trainer.rl import RLTrainer
from mmrl.trainer.weight_transport import build_transport
from mmrl.tracking import Tracker
from mmrl.workers.rollout_worker import RolloutWorker


@dataclass
class InFlight:
    """A batch submitted to the rollout pool: its prompts, the loader's state before they were drawn, and the call."""

    prompts: Batch
    loader_state: dict[str, Any]
    pending: Pending


class AsyncRLTrainer(RLTrainer):
    """:class:`RLTrainer` whose steps train on batches a separate rollout pool generated ahead of them."""

    rollout_worker: type = RolloutWorker
    trainer_generates = False

    def reset_progress(self) -> None:
        super().reset_progress()
        self.inflight: deque[InFlight] = deque()
        self.trainer_version = 0
        self.to_publish = True  # the trainer's weights are not published yet
        self.rollout_restarts = 0

    @property
    def depth(self) -> int:
        """Batches in flight: ``max_staleness + 1`` (wait), one more (drop)."""
        trainer = self.cfg.trainer
        return trainer.max_staleness + 1 + (trainer.stale_policy == "drop")

    # ---- set-up -------------------------------------------------------------------------------

    def worker_shape(self, use_gpu: bool, pools: int) -> tuple[float, int]:
        """The trainer's pools and the rollout pool run at once: the CPUs are split over all their bundles."""
        self.rollout_shape = worker_shape(self.cfg.resources, use_gpu, pools, others=self.cfg.rollout.num_workers)
        return self.rollout_shape

    def build_workers(self) -> None:
        """The sync mode's groups (the actor without a rollout engine), the weight transport and the rollout pool."""
        super().build_workers()
        self.transport = build_transport(self.cfg.rollout.weight_transport)
        self.build_rollout_pool()

    def build_rollout_pool(self) -> None:
        cfg, res = self.cfg, self.cfg.resources
        use_gpu = resolve_device(res.device).type == "cuda"
        cpus, threads = self.rollout_shape
        pool = ResourcePool(cfg.rollout.num_workers, cpus, use_gpu, name="rollout", reuse=res.reuse_workers)
        self.rollout_pool = WorkerGroup(self.rollout_worker, pool, threads=threads, device=res.device,
                                        timeout_s=cfg.trainer.step_timeout_s)
        self.rollout_pool.init_model(cfg, self.checkpoint, self.transport)
        if cfg.rollout.agent.enabled:
            self.tool_names = self.rollout_pool.tool_names()  # the pool's ranks run the tools

    def restore(self, folder: Path) -> None:
        super().restore(folder)
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
            pending = self.rollout_pool.submit("generate", prompts, self.sampling)
            self.inflight.append(InFlight(prompts, state, pending))

    def next_prompts(self) -> Batch:
        self.fill()
        return self.inflight[0].prompts

    def sample(self, prompts: Batch) -> tuple[Batch, dict[str, float]]:
        """The oldest batch in flight, scored (the sync mode's ``gen`` is this mode's ``wait_rollout``)."""
        batch = self.take_oldest(prompts, self.sampling)
        with self.timer("reward"):
            return self.score(batch)

    def take_oldest(self, prompts: Batch, params: Any) -> Batch:
        """The oldest batch in flight (``prompts``'), waited for; a batch older than ``max_staleness`` is dropped
        (``drop``) and the next one taken, with the queue topped up."""
        dropped = 0
        while True:
            start = time.perf_counter()
            samples = self.take()
            self.timing["wait_rollout"] = self.timing.get("wait_rollout", 0.0) + time.perf_counter() - start
            head = self.inflight.popleft()
            staleness = self.trainer_version - samples["weight_version"]
            if int(staleness.max()) <= self.cfg.trainer.max_staleness:
                break
            dropped += len(head.prompts)
            self.fill()
            prompts = self.inflight[0].prompts
        self.async_metrics = {
            "async/staleness_mean": float(staleness.float().mean()), "async/staleness_max": float(staleness.max()),
            "async/dropped_groups": float(dropped), "async/buffer_batches": float(len(self.inflight)),
            "timing_s/wait_weights": float(samples["rollout_wait_s"].max()),
        }
        samples.tensors.pop("rollout_wait_s")
        return prompts.repeat(params.n).union(samples)

    def take(self) -> Batch:
        """The head batch's samples; a failed rollout pool is rebuilt and every batch in flight submitted again."""
        try:
            return self.inflight[0].pending.result()
        except WorkerFailure as failure:
            self.restart_rollout_pool(failure)
            return self.inflight[0].pending.result()

    def restart_rollout_pool(self, failure: WorkerFailure) -> None:
        print(f"rollout pool failed ({failure}); rebuilding it and generating the {len(self.inflight)} batches in "
              "flight again", flush=True)
        self.rollout_pool.shutdown()
        self.build_rollout_pool()
        self.rollout_restarts += 1
        for item in self.inflight:
            item.pending = self.rollout_pool.submit("generate", item.prompts, self.sampling)

    # ---- the step -----------------------------------------------------------------------------

    def begin_step(self) -> int:
        """Every group drops the last step's prompt encodings (the trainer has no engine to sync)."""
        for group in (self.workers, *self.groups.values()):
            group.forget_prompts()
        return 0

    def sync_weights(self, wake: bool) -> int:
        """After an update: publish the trainer's weights, for the pool's next batches."""
        with self.timer("update_weights"):
            return self.publish()

    def publish(self) -> int:
        """Gather the trainer's weights and send them through the transport (a collective on its ranks); 1 when the
        published version changed (or none from this trainer was published yet), else 0."""
        version = self.workers.publish_weights(self.transport)
        moved = int(version != self.trainer_version or self.to_publish)
        self.trainer_version, self.to_publish = version, False
        return moved

    def step(self, prompts: Batch) -> dict[str, float]:
        self.async_metrics = {}
        metrics = super().step(prompts)
        self.fill()  # the next batches start on the weights just published
        return metrics | self.async_metrics | {"async/rollout_restarts": float(self.rollout_restarts)}

    def driver_state(self, tracker: Tracker) -> DriverState:
        """The loader as it was before the oldest untrained batch was drawn: a resumed run draws it again."""
        state = super().driver_state(tracker)
        if self.inflight:
            state.loader = self.inflight[0].loader_state
        return state

    def validate(self, tracker: Tracker, step: int) -> dict[str, float]:
        """Evaluation on the rollout pool, with the newest published weights (the trainer has no engine)."""
        with self.timer("val"):
            result: EvalResult = evaluate(self.generate_once, self.val_rows, self.reward.verify,
                                          self.cfg.eval.batch_size, self.cfg.eval.max_new_tokens)
        tracker.log_dict(samples_table(result.samples), f"rollouts/step_{step:05d}.json")
        tracker.log_text(samples_html(result.samples, f"val rollouts at step {step}"), f"rollouts/step_{step:05d}.html")
        return result.metrics("val") | {"timing_s/val": self.timing["val"]}

    def generate_once(self, prompts: Batch, params: Any) -> Batch:
        return self.rollout_pool.generate(prompts, params)

    def shutdown(self) -> None:
        pool = getattr(self, "rollout_pool", None)
        if pool is not None:
            pool.shutdown()
        self.rollout_pool = None
        self.inflight = deque()
        super().shutdown()

