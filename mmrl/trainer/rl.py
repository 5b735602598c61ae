"""The RL driver: one controller program over the hybrid actor/rollout/reference worker group (and the
critic, reward-model and judge groups the run needs), for every ``trainer.mode``.

One step, as in docs/architecture.md::

    prompts (from the rollout source) -> the collection (the algorithm's rounds over the source's samples, the
    rewards and the scoring stages) -> old (and ref) log-probs -> (critic values) -> the algorithm's advantages
    -> (critic update) -> actor update -> the source's weight hand-over

What differs between runs comes from objects the run is built with, never from a flag the step reads: the
algorithm's declarations and hooks (:mod:`mmrl.algos`), the rollout source (:mod:`mmrl.trainer.sources`: the
hybrid engine in sync mode, a rollout pool in async mode), the kind of sample (:mod:`mmrl.trainer.episodes`)
and the scoring stages (:mod:`mmrl.trainer.collection`).
Around the steps: a resumable checkpoint every ``trainer.save_every`` steps, resume from one, and recovery
from a dead or hung worker (rebuild the groups, load the newest checkpoint, carry on).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from mmrl.algos import build_algorithm, needs_reference
from mmrl.algos.kl_control import build_kl_controller, kl_in_reward
from mmrl.algos.rollout_correction import IS_WEIGHTS, rollout_is_weights
from mmrl.config import Config
from mmrl.controller import WorkerFailure
from mmrl.models.loading import check_checkpoint, grid_pixels, load_processor
from mmrl.protocol import Batch
from mmrl.rollout.sampling import SamplingParams
from mmrl.run_config import prepare_run_config
from mmrl.trainer.checkpoint import CheckpointManager, DriverState, check_resumable, load_driver_state, resume_note
from mmrl.trainer.collection import Collection, score_stages
from mmrl.trainer.dataset import PromptLoader, load_rows
from mmrl.trainer.episodes import episode_kind
from mmrl.trainer.evaluation import EvalResult, evaluate, samples_html, samples_table, stops_early
from mmrl.trainer.groups import TrainerGroups, check_same_tokenizer
from mmrl.trainer.guidance import fill_behaviour
from mmrl.trainer.metrics import memory_metrics, non_finite, step_metrics, timing_metrics, value_metrics
from mmrl.trainer.old_log_probs import OldLogProbs
from mmrl.trainer.pass_rates import PassRates, SamplingRules
from mmrl.trainer.perf import MFUAccount, save_profile
from mmrl.trainer.plots import plot_curves
from mmrl.trainer.reward_stage import RewardStage
from mmrl.trainer.sources import RolloutSource, build_source
from mmrl.trainer.tracking import Tracker, console_line
from mmrl.trajectory import policy_mask
from mmrl.workers.critic import CriticWorker
from mmrl.workers.hybrid import ActorRolloutRefWorker

log = logging.getLogger(__name__)

CONSOLE = {"critic/score/mean": "score", "train/acc": "acc", "val/acc": "val_acc", "actor/pg_loss": "pg_loss",
           "actor/entropy": "entropy", "critic/flat_groups": "flat", "response_length/mean": "resp_len",
           "timing_s/step": "step_s"}
CURVES = {
    "reward": ["critic/score/mean", "train/acc"],
    "accuracy": ["val/acc"],
    "policy": ["actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac"],
    "critic": ["critic/vf_loss", "critic/vf_explained_var"],
}


class RLTrainer:
    """The RL loop of every mode: see the module docstring."""

    # The groups' worker classes (a test may put probed subclasses here; the rollout pool's: ``source.worker``).
    actor_worker: type = ActorRolloutRefWorker
    critic_worker: type = CriticWorker

    def __init__(self, cfg: Config, checkpoint: str | None = None, source: RolloutSource | None = None) -> None:
        """``source``: where the samples come from; None: the one ``trainer.mode`` names."""
        self.cfg = cfg = prepare_run_config(cfg)  # checked; a resolved copy (equal to cfg if cfg was resolved)
        self.checkpoint = checkpoint or cfg.trainer.init
        check_checkpoint(self.checkpoint, "trainer.init")  # before any worker starts
        self.algorithm = build_algorithm(cfg)
        self.with_reference = needs_reference(cfg)
        self.old_log_probs = OldLogProbs(cfg, self.timer)
        self.sampling = SamplingParams(
            n=cfg.rollout.n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k, max_new_tokens=cfg.rollout.max_new_tokens,
        )
        self.source = source or build_source(cfg, self.checkpoint, self.sampling)
        self.episodes = episode_kind(cfg)
        reward = cfg.reward
        for path, key in ((reward.model.path, "reward.model.path"), (reward.judge.path, "reward.judge.path")):
            if path:
                check_checkpoint(path, key)
        processor = load_processor(self.checkpoint)
        if reward.model.path:
            check_same_tokenizer(self.checkpoint, reward.model.path)
        # One per run: its reward worker processes outlive a recovery's new worker groups.
        self.reward = RewardStage(reward, max_response_tokens=self.episodes.longest, patch_size=grid_pixels(processor))
        self.train_rows = load_rows(cfg.data.dir, "train")
        self.val_rows = load_rows(cfg.data.dir, "val", limit=cfg.trainer.val_size)
        self.checkpoints = CheckpointManager(cfg.trainer.out_dir, cfg.trainer.keep_last)
        self.collection = Collection(self.algorithm, self.source, self.reward,
                                     score_stages(cfg, processor.tokenizer, self.episodes, self.guide_episodes),
                                     self.sampling, self.timer)
        self.timing: dict[str, float] = {}
        self.mfu = MFUAccount(cfg, self.checkpoint)
        self.restarts = 0
        self.reset_progress()

    def reset_progress(self) -> None:
        """Step 0: the loader at its seed, no pass rates yet, no checkpoint to come back to."""
        trainer = self.cfg.trainer
        self.pass_rates = PassRates()
        self.rules = SamplingRules(self.pass_rates, trainer.skip_solved_after, trainer.unsolved_revisit_rate)
        self.loader = PromptLoader(self.train_rows, trainer.prompts_per_step, self.cfg.seed, self.rules)
        self.step_no, self.skipped_in_a_row = 0, 0
        self.stopped_at: float | None = None  # the val/acc at which the run stopped early (trainer.stop_val_acc)
        self.kl_ctrl = build_kl_controller(self.cfg.algorithm)
        self.last_checkpoint: Path | None = None
        self.source.reset()

    # ---- set-up -------------------------------------------------------------------------------

    def build_workers(self) -> None:
        """The worker groups (:class:`~mmrl.trainer.groups.TrainerGroups`), then the rollout source's own."""
        self.reward.launch()  # its worker processes load while the groups build
        groups = TrainerGroups.build(self.cfg, self.checkpoint, self.with_reference, self.algorithm.needs_critic,
                                     self.source, actor=self.actor_worker, critic=self.critic_worker)
        self.workers, self.groups, self.critic = groups.actor, groups.others, groups.others.get("critic")
        self.share_contexts = self.episodes.shares_contexts(self.groups)
        self.source.build(self.workers, self.share_contexts, self.timer)
        self.tool_names = self.episodes.tool_names(self.source.episode_group)
        self.reward.connect(model=self.groups.get("reward_model"), judge=self.groups.get("judge"))

    def log_batching(self, tracker: Tracker) -> None:
        """Print and log (``micro_batching.<pass>`` params) each pass's micro-batching."""
        sizes: dict[str, str] = {}
        for group in (self.workers, *self.groups.values()):
            sizes |= group.micro_batching()
        print("micro-batches: " + ", ".join(f"{name} {size}" for name, size in sizes.items()), flush=True)
        tracker.log_params({f"micro_batching.{name}": size for name, size in sizes.items()})

    # ---- the loop -----------------------------------------------------------------------------

    def fit(self, tracker: Tracker, resume: Path | None = None) -> dict[str, float]:
        """Run up to ``trainer.steps`` (from ``resume`` when given), recovering from worker failures;
        export the final policy in Hugging Face format."""
        self.build_workers()
        self.log_batching(tracker)
        if self.cfg.tracking.mfu:
            tracker.log_metrics(self.mfu.measure(self.workers), 0)
        if resume is not None:
            self.restore(resume)
        last_eval: dict[str, float] = {}
        while self.step_no < self.cfg.trainer.steps and self.stopped_at is None:
            try:
                last_eval = self.train_step(tracker) or last_eval
            except WorkerFailure as failure:
                self.recover(failure, tracker)
        self.export(tracker)
        return last_eval

    def train_step(self, tracker: Tracker) -> dict[str, float] | None:
        """Step ``step_no + 1``: train, evaluate when due, log, checkpoint when due (and when the run stops early
        at ``trainer.stop_val_acc``). Returns the eval metrics."""
        cfg, step = self.cfg.trainer, self.step_no + 1
        prompts = self.source.next_prompts(self.loader)
        if step in cfg.profile_steps:
            self.workers.start_profile()
        metrics = self.step(prompts)
        if step in cfg.profile_steps:
            save_profile(self.workers, tracker, Path(cfg.out_dir) / "profile" / f"step_{step}", self.timing, metrics)
        self.count_skip(step, metrics)
        evaluated = None
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            evaluated = self.validate(tracker, step)
            stop = stops_early(cfg, step, evaluated["val/acc"])
            self.stopped_at = evaluated["val/acc"] if stop else None
            metrics |= evaluated | ({"trainer/stopped_early": float(stop)} if cfg.stop_val_acc else {})
        tracker.log_metrics(metrics, step)
        if evaluated is not None:
            self.log_curves(tracker)  # refreshed at every evaluation, so a live run shows its curves
        print(console_line(step, cfg.steps, metrics, CONSOLE), flush=True)
        self.step_no = step
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps or self.stopped_at is not None:
            self.save(tracker)
        return evaluated

    def step(self, prompts: Batch) -> dict[str, float]:
        """One RL step on a Batch of prompts; returns its metrics. Skips the updates (and says so in
        ``trainer/skipped_step``) when a reward or an advantage is not finite."""
        self.timing = {}
        with self.timer("step"):
            syncs = self.begin_step()
            batch, metrics = self.collect(prompts)
            self.episodes.trace(batch, self.step_no + 1)  # tracking.trace_episodes of them, as MLflow traces
            self.source.release()
            self.timing |= self.source.phase_seconds()
            batch = self.old_log_probs.add(batch, self.workers)
            fill_behaviour(batch)  # the guides' (trainer.guide_unsolved), which no engine drew
            metrics |= self.correct_rollouts(batch)
            batch = self.reference_and_values(batch)
            metrics |= self.penalise_kl(batch)
            with self.timer("adv"):
                batch = batch.union(self.algorithm.compute_advantages(batch))
            metrics |= self.update(batch)
            syncs += self.source.after_update()
        metrics |= step_metrics(batch) | value_metrics(batch) | {"rollout/weight_syncs": float(syncs)}
        metrics |= self.episodes.metrics(batch, self.tool_names) | self.rules.metrics() | self.source.metrics()
        metrics |= memory_metrics(metrics, {"actor": self.workers, **self.groups})
        metrics |= self.mfu.metrics(batch, self.timing)
        return metrics | timing_metrics(batch, self.timing, self.workers.world_size)

    def begin_step(self) -> int:
        """Every group drops the last step's prompt encodings and opens its peak-memory window; the source starts its
        step (the hybrid engine gets the current weights). Returns the number of weight syncs (0 or 1)."""
        for group in (self.workers, *self.groups.values()):
            group.forget_prompts()
        return self.source.begin_step()

    def collect(self, prompts: Batch) -> tuple[Batch, dict[str, float]]:
        """The step's samples and the metrics of collecting them (:class:`~mmrl.trainer.collection.Collection`)."""
        return self.collection.collect(prompts, self.loader.next_batch, self.pass_rates)

    def guide_episodes(self, rows: Batch) -> Batch:
        """The guide episodes of ``trainer.guide_unsolved`` with agent rollouts, each run by the rank that holds its
        prompt (:meth:`ActorRolloutRefWorker.guide_episodes`)."""
        return self.workers.guide_episodes(rows, share_contexts=self.share_contexts)

    def correct_rollouts(self, batch: Batch) -> dict[str, float]:
        """The rollout correction's weights (``actor.rollout_correction``; none with ``none``) into the batch; their
        metrics."""
        actor = self.cfg.actor
        if actor.rollout_correction == "none":
            return {}
        weights, metrics = rollout_is_weights(batch["old_log_probs"], batch["rollout_log_probs"], policy_mask(batch),
                                              actor.rollout_correction, actor.rollout_is_cap)
        batch.tensors[IS_WEIGHTS] = weights
        return {f"actor/{key}": value for key, value in metrics.items()}

    def reference_and_values(self, batch: Batch) -> Batch:
        """The reference policy's log-probs and the critic's values, each when the run has that model."""
        if self.with_reference:
            with self.timer("ref"):
                batch = batch.union(self.workers.compute_ref_log_probs(batch))
        if self.critic is not None:
            with self.timer("values"):
                batch = batch.union(self.critic.compute_values(batch))
        return batch

    def penalise_kl(self, batch: Batch) -> dict[str, float]:
        """With ``algorithm.use_kl_in_reward``: subtract the controller's coefficient x the per-token KL to the
        reference from the token rewards; the KL metrics."""
        if not self.cfg.algorithm.use_kl_in_reward:
            return {}
        coef = self.kl_ctrl.value
        rewards, kl = kl_in_reward(batch["token_level_rewards"], batch["old_log_probs"], batch["ref_log_probs"],
                                   policy_mask(batch), coef, self.cfg.algorithm.kl_penalty)
        batch.tensors["token_level_rewards"] = rewards
        self.kl_ctrl.update(kl, len(batch))
        return {"actor/reward_kl": kl, "actor/reward_kl_coef": coef}

    def update(self, batch: Batch) -> dict[str, float]:
        """The critic's update and, when the algorithm trains the actor this step, the actor's, unless a reward
        or advantage is not finite. ``trainer/actor_waits`` marks a step whose actor the algorithm held back."""
        bad = non_finite(batch, ("token_level_rewards", "advantages", "returns"))
        if bad:
            log.warning("non-finite %s in this step's batch: the critic and actor updates are skipped", bad)
            return {"trainer/skipped_step": 1.0}
        metrics: dict[str, float] = {}
        if self.critic is not None:
            with self.timer("update_critic"):
                metrics |= self.critic.update_critic(batch)[0]
        if not self.algorithm.trains_actor(self.step_no):
            return metrics | {"trainer/skipped_step": 0.0, "trainer/actor_waits": 1.0}
        with self.timer("update_actor"):
            metrics |= self.workers.update_actor(batch)[0]
        skipped = metrics.get("actor/skipped_updates", 0.0) + metrics.get("critic/skipped_updates", 0.0)
        return metrics | {"trainer/skipped_step": float(skipped > 0)}

    def count_skip(self, step: int, metrics: dict[str, float]) -> None:
        """Stop the run when more than ``trainer.max_skipped_steps`` steps in a row skipped their update."""
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if metrics["trainer/skipped_step"] else 0
        if self.skipped_in_a_row > self.cfg.trainer.max_skipped_steps:
            raise RuntimeError(
                f"step {step}: {self.skipped_in_a_row} steps in a row skipped their update for non-finite rewards, "
                f"advantages, losses or gradients (trainer.max_skipped_steps={self.cfg.trainer.max_skipped_steps}); "
                "see the warnings above for which, and check the reward function and the learning rate"
            )

    @contextmanager
    def timer(self, name: str) -> Iterator[None]:
        """Adds the block's seconds to ``timing[name]`` (a stage may run several times in a step)."""
        start = time.perf_counter()
        yield
        self.timing[name] = self.timing.get(name, 0.0) + time.perf_counter() - start

    # ---- checkpoints and recovery -------------------------------------------------------------

    def save(self, tracker: Tracker) -> None:
        """A resumable checkpoint of the step just finished (every group writes its part, then the driver)."""
        start = time.perf_counter()
        tmp = self.checkpoints.begin(self.step_no)
        self.workers.save_state(str(tmp / "actor"))
        if self.critic is not None:
            self.critic.save_state(str(tmp / "critic"))
        state = self.driver_state(tracker)
        meta = {"algorithm": self.cfg.algorithm.name, "num_workers": self.cfg.resources.num_workers,
                "actor_layout": [self.cfg.actor.vision.strategy, self.cfg.actor.llm.strategy],
                "init": self.checkpoint, "lora_rank": self.cfg.actor.lora.rank}
        self.last_checkpoint = self.checkpoints.commit(tmp, state, meta)
        tracker.log_metrics({"timing_s/save_checkpoint": time.perf_counter() - start}, self.step_no)

    def driver_state(self, tracker: Tracker) -> DriverState:
        """What the driver saves in a checkpoint: the step, the run, the loader (as the source says: the async pool's
        in-flight prompts are drawn again), the skip count, the KL coefficient, the pass rates, whether the run
        stopped early."""
        return DriverState(self.step_no, tracker.run_id, self.source.loader_state(self.loader.state_dict()),
                           self.skipped_in_a_row, self.kl_ctrl.value, self.pass_rates.state_dict(),
                           self.stopped_at)

    def restore(self, folder: Path) -> None:
        """Load a checkpoint into the (freshly built) groups and the driver."""
        if self.critic is not None and not (folder / "critic").is_dir():
            raise ValueError(f"{folder} holds no critic, but algorithm.name={self.cfg.algorithm.name} needs one; "
                             "resume with the algorithm it was saved with, or trainer.resume=never")
        check_resumable(folder, self.cfg, self.checkpoint)
        state = load_driver_state(folder)
        self.workers.load_state(str(folder / "actor"))
        if self.critic is not None:
            self.critic.load_state(str(folder / "critic"))
        self.loader.load_state_dict(state.loader)
        self.step_no, self.skipped_in_a_row = state.step, state.skipped_in_a_row
        stays = state.stopped_at is not None and stops_early(self.cfg.trainer, state.step, state.stopped_at)
        self.stopped_at = state.stopped_at if stays else None  # stopped early: so while the config stops it there
        if state.kl_coef is not None:
            self.kl_ctrl.value = state.kl_coef
        if state.pass_rates is not None:
            self.pass_rates.load_state_dict(state.pass_rates)
        self.last_checkpoint = folder
        self.source.restored()
        print(resume_note(folder, state.step, self.cfg.trainer.steps, stays), flush=True)

    def recover(self, failure: WorkerFailure, tracker: Tracker) -> None:
        """Rebuild the worker groups and continue from the newest checkpoint (or from step 0)."""
        limit = self.cfg.trainer.max_restarts
        if self.restarts >= limit:
            raise RuntimeError(f"a worker failed again after {self.restarts} restarts (trainer.max_restarts="
                               f"{limit}): {failure}") from failure
        self.restarts += 1
        point = self.last_checkpoint
        print(f"restart {self.restarts}/{limit} at step {self.step_no + 1}: {failure}; rebuilding the workers from "
              f"{point or 'trainer.init (no checkpoint yet)'}", flush=True)
        self.shutdown()
        self.reset_progress()
        self.build_workers()
        if point is not None:
            self.restore(point)
        tracker.log_metrics({"trainer/restarts": float(self.restarts)}, self.step_no + 1)

    def export(self, tracker: Tracker) -> None:
        """The final policy in Hugging Face format (and the critic's weights); the policy also as the run's MLflow
        model (``tracking.log_model``), registered when ``tracking.register_model`` names it."""
        out = Path(self.cfg.trainer.out_dir)
        path = self.workers.save_checkpoint(str(out / "checkpoint"))
        tracker.log_text(path, "checkpoint_path.txt")
        if self.cfg.tracking.log_model:
            tracker.log_model(path, self.cfg.tracking.register_model)
        if self.critic is not None:
            self.critic.save_checkpoint(str(out / "critic"))

    # ---- evaluation and artifacts -------------------------------------------------------------

    def validate(self, tracker: Tracker, step: int) -> dict[str, float]:
        """Accuracy on the val split (``trainer.val_size`` prompts) with the current weights, from the source's
        engine; the samples logged as ``rollouts/step_<N>.{json,html}``."""
        with self.timer("val"), self.source.serving() as generate:
            result: EvalResult = evaluate(generate, self.val_rows, self.reward.verify, self.cfg.eval.batch_size,
                                          self.cfg.eval.max_new_tokens)
        tracker.log_dict(samples_table(result.samples), f"rollouts/step_{step:05d}.json")
        tracker.log_text(samples_html(result.samples, f"val rollouts at step {step}"), f"rollouts/step_{step:05d}.html")
        return result.metrics("val") | {"timing_s/val": self.timing["val"]}

    def log_curves(self, tracker: Tracker) -> None:
        """The run's curves so far as ``curves.png``."""
        panels = {title: keys for title, keys in CURVES.items() if any(k in tracker.history for k in keys)}
        figure = plot_curves(tracker.history, panels)
        tracker.log_figure(figure, "curves.png")

    def shutdown(self) -> None:
        """Stop the rollout source's workers and every worker group (the reward processes live on: a recovery reuses
        them; see close())."""
        self.source.shutdown()
        for group in [*getattr(self, "groups", {}).values(), getattr(self, "workers", None)]:
            if group is not None:
                group.shutdown()
        self.groups = {}

    def close(self) -> None:
        """Stop the worker groups and the reward processes."""
        self.shutdown()
        self.reward.close()
