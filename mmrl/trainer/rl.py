"""The RL driver: one controller program over the hybrid actor/rollout/reference worker group (and the
critic group when the algorithm needs one).

One step, as in docs/architecture.md::

    prompts -> the algorithm's collection (generate n responses, rewards, extra rollouts, filter, more rounds)
    -> old (and ref) log-probs -> (critic values) -> the algorithm's advantages -> (critic update) -> actor update

What differs between algorithms comes from the algorithm object's declarations and hooks (:mod:`mmrl.algos`),
never from its name or from a setting one algorithm owns.
Around the steps: a resumable checkpoint every ``trainer.save_every`` steps, resume from one, and recovery
from a dead or hung worker (rebuild the groups, load the newest checkpoint, carry on).
"""

from __future__ import annotations

import functools
import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Literal

import torch

from mmrl.agent.rollout import agent_metrics
from mmrl.algos import RolloutContext, build_algorithm, needs_reference
from mmrl.algos.kl_control import build_kl_controller, kl_in_reward
from mmrl.algos.rollout_correction import IS_WEIGHTS, rollout_is_weights
from mmrl.config import Config
from mmrl.controller import ResourcePool, WorkerFailure, WorkerGroup
from mmrl.controller.session import ensure_ray, worker_shape
from mmrl.controller.worker import resolve_device
from mmrl.models.loading import check_checkpoint, grid_pixels, load_processor
from mmrl.perf_memory import PEAK_KEY
from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams
from mmrl.run_config import prepare_run_config
from mmrl.tracking import Tracker, console_line
from mmrl.trainer.checkpoint import CheckpointManager, DriverState, check_resumable, load_driver_state, resume_point
from mmrl.trainer.dataset import PromptLoader, load_rows
from mmrl.trainer.evaluation import EvalResult, evaluate, samples_html, samples_table
from mmrl.trainer.guidance import Guidance, fill_behaviour
from mmrl.trainer.metrics import non_finite, step_metrics, timing_metrics, value_metrics
from mmrl.trainer.pass_rates import PassRates, SamplingRules
from mmrl.trainer.plots import plot_curves
from mmrl.trainer.reward_stage import RewardStage
from mmrl.trainer.sft import response_ids
from mmrl.trajectory import place_on_last_token, policy_mask
from mmrl.workers.actor import on_policy
from mmrl.workers.critic import CriticWorker
from mmrl.workers.hybrid import ActorRolloutRefWorker
from mmrl.workers.judge import JudgeWorker
from mmrl.workers.reward_model import RewardModelWorker

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
    # The worker classes of the groups (a test or benchmark may put probed subclasses here).
    actor_worker: type = ActorRolloutRefWorker
    critic_worker: type = CriticWorker
    trainer_generates: bool = True
    """Whether the actor's workers hold the rollout engine (sync: they do; async: a rollout pool does)."""

    def __init__(self, cfg: Config, checkpoint: str | None = None) -> None:
        self.cfg = cfg = prepare_run_config(cfg)  # checked; a resolved copy (equal to cfg if cfg was resolved)
        self.checkpoint = checkpoint or cfg.trainer.init
        check_checkpoint(self.checkpoint, "trainer.init")  # before any worker starts
        self.algorithm = build_algorithm(cfg)
        self.with_reference = needs_reference(cfg)
        self.old_log_probs = old_log_prob_source(cfg)
        self.sampling = SamplingParams(
            n=cfg.rollout.n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k, max_new_tokens=cfg.rollout.max_new_tokens,
        )
        reward = cfg.reward
        for path, key in ((reward.model.path, "reward.model.path"), (reward.judge.path, "reward.judge.path")):
            if path:
                check_checkpoint(path, key)
        processor = load_processor(self.checkpoint)
        patch_size = grid_pixels(processor)
        if reward.model.path:
            check_same_tokenizer(self.checkpoint, reward.model.path)
        # One per run: its reward worker processes outlive a recovery's new worker groups.
        agent = cfg.rollout.agent
        longest = agent.max_tokens if agent.enabled else cfg.rollout.max_new_tokens  # an episode's: all its turns
        self.reward = RewardStage(reward, max_response_tokens=longest, patch_size=patch_size)
        self.train_rows = load_rows(cfg.data.dir, "train")
        self.val_rows = load_rows(cfg.data.dir, "val", limit=cfg.trainer.val_size)
        self.checkpoints = CheckpointManager(cfg.trainer.out_dir, cfg.trainer.keep_last)
        self.guidance = (Guidance(functools.partial(response_ids, processor.tokenizer),
                                  self.guide_episodes if agent.enabled else None)
                         if cfg.trainer.guide_unsolved else None)
        self.timing: dict[str, float] = {}
        self.restarts = 0
        self.reset_progress()

    def reset_progress(self) -> None:
        """Step 0: the loader at its seed, no pass rates yet, no checkpoint to come back to."""
        trainer = self.cfg.trainer
        self.pass_rates = PassRates()
        self.rules = SamplingRules(self.pass_rates, trainer.skip_solved_after, trainer.unsolved_revisit_rate)
        self.loader = PromptLoader(self.train_rows, trainer.prompts_per_step, self.cfg.seed, self.rules)
        self.step_no, self.skipped_in_a_row = 0, 0
        self.kl_ctrl = build_kl_controller(self.cfg.algorithm)
        self.last_checkpoint: Path | None = None

    # ---- set-up -------------------------------------------------------------------------------

    def build_workers(self) -> None:
        """The actor-rollout-ref group, and the critic group when the algorithm needs one (colocated on
        the actor's pool, or on its own)."""
        cfg, res, timeout = self.cfg, self.cfg.resources, self.cfg.trainer.step_timeout_s
        ensure_ray(res)
        use_gpu = resolve_device(res.device).type == "cuda"
        # Each group beside the actor's: (name, worker class, placement, checkpoint).
        extra = [(name, worker, placement, path) for name, worker, placement, path, wanted in (
            ("critic", self.critic_worker, cfg.critic.placement, cfg.critic.init or self.checkpoint,
             self.algorithm.needs_critic),
            ("reward_model", RewardModelWorker, cfg.reward.model.placement, cfg.reward.model.path,
             bool(cfg.reward.model.path)),
            ("judge", JudgeWorker, cfg.reward.judge.placement, cfg.reward.judge.path, bool(cfg.reward.judge.path)),
        ) if wanted]
        separate = [e for e in extra if e[2] == "separate"]
        cpus, threads = self.worker_shape(use_gpu, pools=1 + len(separate))
        pool = ResourcePool(res.num_workers, cpus, use_gpu, name="actor_rollout_ref", reuse=res.reuse_workers)
        colocated = 1 + len(extra) - len(separate)
        group = dict(threads=threads, device=res.device, timeout_s=timeout)
        self.workers = WorkerGroup(self.actor_worker, pool, share=1.0 / colocated, **group)
        self.workers.init_model(cfg, self.checkpoint, self.with_reference, with_rollout=self.trainer_generates)
        self.tool_names = self.workers.tool_names() if cfg.rollout.agent.enabled else []
        self.groups: dict[str, WorkerGroup] = {}
        for name, worker, placement, path in extra:
            own = placement == "separate"
            own_pool = (ResourcePool(res.num_workers, cpus, use_gpu, name=name, reuse=res.reuse_workers)
                        if own else pool)
            self.groups[name] = WorkerGroup(worker, own_pool, share=1.0 if own else 1.0 / colocated, **group)
            self.groups[name].init_model(cfg, path)
        self.critic = self.groups.get("critic")
        # Agent episodes' scoring contexts go back to the driver when another group scores the samples too (a
        # critic's or a reward model's ranks; the judge reads the episode's record).
        self.share_contexts = cfg.rollout.agent.enabled and bool({"critic", "reward_model"} & set(self.groups))
        self.reward = self.build_reward()

    def worker_shape(self, use_gpu: bool, pools: int) -> tuple[float, int]:
        """(CPUs per bundle, torch threads per worker) of the trainer's ``pools`` pools."""
        return worker_shape(self.cfg.resources, use_gpu, pools=pools)

    def log_batching(self, tracker: Tracker) -> None:
        """Print each pass's micro-batching (the automatic token budgets the workers sized, or the settings) and
        log it as ``micro_batching.<pass>`` params."""
        sizes: dict[str, str] = {}
        for group in (self.workers, *self.groups.values()):
            sizes |= group.micro_batching()
        print("micro-batches: " + ", ".join(f"{name} {size}" for name, size in sizes.items()), flush=True)
        tracker.log_params({f"micro_batching.{name}": size for name, size in sizes.items()})

    def build_reward(self) -> RewardStage:
        """The run's reward stage, scoring with this set of workers' reward-model and judge groups."""
        self.reward.connect(model=self.groups.get("reward_model"), judge=self.groups.get("judge"))
        return self.reward

    # ---- the loop -----------------------------------------------------------------------------

    def fit(self, tracker: Tracker, resume: Path | None = None) -> dict[str, float]:
        """Run up to ``trainer.steps`` (from ``resume`` when given), recovering from worker failures;
        export the final policy in Hugging Face format."""
        self.build_workers()
        self.log_batching(tracker)
        if resume is not None:
            self.restore(resume)
        last_eval: dict[str, float] = {}
        while self.step_no < self.cfg.trainer.steps:
            try:
                last_eval = self.train_step(tracker) or last_eval
            except WorkerFailure as failure:
                self.recover(failure, tracker)
        self.export(tracker)
        return last_eval

    def train_step(self, tracker: Tracker) -> dict[str, float] | None:
        """Step ``step_no + 1``: train, evaluate when due, log, checkpoint when due. Returns the eval metrics."""
        cfg, step = self.cfg.trainer, self.step_no + 1
        metrics = self.step(self.next_prompts())
        self.count_skip(step, metrics)
        evaluated = None
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            evaluated = self.validate(tracker, step)
            metrics.update(evaluated)
        tracker.log_metrics(metrics, step)
        if evaluated is not None:
            self.log_curves(tracker)  # refreshed at every evaluation, so a live run shows its curves
        print(console_line(step, cfg.steps, metrics, CONSOLE), flush=True)
        self.step_no = step
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps:
            self.save(tracker)
        return evaluated

    def next_prompts(self) -> Batch:
        """The prompts of the next step."""
        return self.loader.next_batch()

    def step(self, prompts: Batch) -> dict[str, float]:
        """One RL step on a Batch of prompts; returns its metrics. Skips the updates (and says so in
        ``trainer/skipped_step``) when a reward or an advantage is not finite."""
        self.timing = {}
        with self.timer("step"):
            syncs = self.begin_step()
            batch, metrics = self.collect(prompts)
            self.workers.release_engine()
            if self.old_log_probs == "recompute":
                with self.timer("old_log_prob"):
                    batch = batch.union(self.workers.compute_log_probs(batch))
            elif self.old_log_probs == "rollout":
                batch.tensors["old_log_probs"] = batch["rollout_log_probs"]
            fill_behaviour(batch)  # the guides' (trainer.guide_unsolved), which no engine drew
            if self.cfg.actor.rollout_correction != "none":
                metrics |= self.correct_rollouts(batch)
            if self.with_reference:
                with self.timer("ref"):
                    batch = batch.union(self.workers.compute_ref_log_probs(batch))
            if self.critic is not None:
                with self.timer("values"):
                    batch = batch.union(self.critic.compute_values(batch))
            if self.cfg.algorithm.use_kl_in_reward:
                metrics |= self.penalise_kl(batch)
            with self.timer("adv"):
                batch = batch.union(self.algorithm.compute_advantages(batch))
            metrics |= self.update(batch)
            syncs += self.sync_weights(wake=False)
        metrics |= step_metrics(batch) | value_metrics(batch) | {"rollout/weight_syncs": float(syncs)}
        if self.cfg.rollout.agent.enabled:
            metrics |= agent_metrics(batch, self.tool_names)
        if self.rules.active:
            metrics |= self.rules.metrics()
        metrics |= self.memory_metrics(metrics)
        return metrics | timing_metrics(batch, self.timing, self.workers.world_size)

    def begin_step(self) -> int:
        """Every group drops the last step's prompt encodings and opens its peak-memory window; the engine gets
        the current weights (when its copy is behind or was freed). Returns the number of weight syncs (0 or 1)."""
        for group in (self.workers, *self.groups.values()):
            group.forget_prompts()
        return self.sync_weights(wake=True)

    def sync_weights(self, wake: bool) -> int:
        """The ``update_weights`` stage: the actor's weights into the rollout engine, if its version changed
        (into a freed engine only with ``wake``). Returns 1 when they moved, else 0."""
        with self.timer("update_weights"):
            return self.workers.sync_weights(wake)[0]

    def collect(self, prompts: Batch) -> tuple[Batch, dict[str, float]]:
        """The step's samples and the metrics of collecting them, as the algorithm collects them (by default one
        round of :meth:`sample` and its filter), through this trainer's generation and rewards."""
        ctx = RolloutContext(sampling=self.sampling, sample=self.sample, generate=self.generate, score=self.score,
                             next_prompts=self.loader.next_batch, timer=self.timer)
        return self.algorithm.collect(ctx, prompts)

    def sample(self, prompts: Batch) -> tuple[Batch, dict[str, float]]:
        """``rollout.n`` responses to each prompt, scored; the reward metrics."""
        with self.timer("gen"):
            batch = self.generate(prompts, self.sampling)
        with self.timer("reward"):
            return self.score(batch)

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """``params.n`` responses to each prompt: one row per sample, with its prompt's fields."""
        return prompts.repeat(params.n).union(self.workers.generate(prompts, params,
                                                                     share_contexts=self.share_contexts))

    def correct_rollouts(self, batch: Batch) -> dict[str, float]:
        """The rollout correction's weights (``actor.rollout_correction``) into the batch; their metrics."""
        actor = self.cfg.actor
        weights, metrics = rollout_is_weights(batch["old_log_probs"], batch["rollout_log_probs"], policy_mask(batch),
                                              actor.rollout_correction, actor.rollout_is_cap)
        batch.tensors[IS_WEIGHTS] = weights
        return {f"actor/{key}": value for key, value in metrics.items()}

    def penalise_kl(self, batch: Batch) -> dict[str, float]:
        """Subtract the controller's coefficient x the per-token KL to the reference from the token rewards."""
        coef = self.kl_ctrl.value
        rewards, kl = kl_in_reward(batch["token_level_rewards"], batch["old_log_probs"], batch["ref_log_probs"],
                                   policy_mask(batch), coef, self.cfg.algorithm.kl_penalty)
        batch.tensors["token_level_rewards"] = rewards
        self.kl_ctrl.update(kl, len(batch))
        return {"actor/reward_kl": kl, "actor/reward_kl_coef": coef}

    def score(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """The reward stage's scores as ``token_level_rewards`` (on each response's last policy token), the
        verifier's ``correct``, and the reward metrics (``train/acc`` among them)."""
        out = self.reward.score(batch)
        self.pass_rates.record(batch["uid"], out.correct)  # the policy's own samples
        scores, correct, metrics = out.scores, out.correct, out.metrics
        if self.guidance is not None:
            batch, scores, correct, guided = self.guidance.apply(batch, scores, correct, self.score_rows)
            metrics = metrics | guided
        batch.tensors["token_level_rewards"] = place_on_last_token(scores, policy_mask(batch))
        batch.tensors["correct"] = correct
        return batch, metrics

    def guide_episodes(self, rows: Batch) -> Batch:
        """The guide episodes of ``trainer.guide_unsolved`` with agent rollouts, each run by the rank that holds its
        prompt (:meth:`ActorRolloutRefWorker.guide_episodes`)."""
        return self.workers.guide_episodes(rows, share_contexts=self.share_contexts)

    def score_rows(self, rows: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The reward stage's (scores, correct), each (K,), of K samples (the guides of ``trainer.guide_unsolved``)."""
        out = self.reward.score(rows)
        return out.scores, out.correct

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

    def memory_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """``perf/max_memory_gb/<group>`` (the largest peak of the group's ranks in this step: actor, critic,
        reward_model, judge) and ``perf/max_memory_gb`` (the largest of them). A group's update reports its own
        in ``metrics`` (its peak up to the update's end); the other groups are asked at the step's end."""
        peaks = {}
        for name, group in {"actor": self.workers, **self.groups}.items():
            key = f"{PEAK_KEY}/{name}"
            peaks[key] = metrics[key] if key in metrics else max(group.peak_memory_gb())
        return peaks | {PEAK_KEY: max(peaks.values())}

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
        """What the driver saves in a checkpoint: the step, the run, the loader, the skip count, the KL coefficient."""
        return DriverState(self.step_no, tracker.run_id, self.loader.state_dict(), self.skipped_in_a_row,
                           self.kl_ctrl.value, self.pass_rates.state_dict())

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
        if state.kl_coef is not None:
            self.kl_ctrl.value = state.kl_coef
        if state.pass_rates is not None:
            self.pass_rates.load_state_dict(state.pass_rates)
        self.last_checkpoint = folder
        steps = self.cfg.trainer.steps
        left = f"{steps - state.step} steps to go" if state.step < steps else (
            f"nothing left to train (trainer.steps={steps}); use trainer.resume=never or another out_dir "
            "for a fresh run")
        print(f"resumed from {folder} at step {state.step}: {left}", flush=True)

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
        with self.timer("val"):
            self.sync_weights(wake=True)
            result: EvalResult = evaluate(self.workers.generate_once, self.val_rows, self.reward.verify,
                                          self.cfg.eval.batch_size, self.cfg.eval.max_new_tokens)
            self.workers.release_engine()
        tracker.log_dict(samples_table(result.samples), f"rollouts/step_{step:05d}.json")
        tracker.log_text(samples_html(result.samples, f"val rollouts at step {step}"), f"rollouts/step_{step:05d}.html")
        return result.metrics("val") | {"timing_s/val": self.timing["val"]}

    def log_curves(self, tracker: Tracker) -> None:
        panels = {title: keys for title, keys in CURVES.items() if any(k in tracker.history for k in keys)}
        figure = plot_curves(tracker.history, panels)
        tracker.log_figure(figure, "curves.png")

    def shutdown(self) -> None:
        """Stop every worker group (the reward processes live on: a recovery reuses them; see close())."""
        for group in [*getattr(self, "groups", {}).values(), getattr(self, "workers", None)]:
            if group is not None:
                group.shutdown()
        self.groups = {}

    def close(self) -> None:
        """Stop the worker groups and the reward processes."""
        self.shutdown()
        self.reward.close()


def run_rl(cfg: Config) -> dict[str, float]:
    """The ``make rl`` stage: train (resuming per ``trainer.resume``), log to MLflow, save
    ``<trainer.out_dir>/checkpoint``."""
    resume = resume_point(cfg)
    trainer = build_trainer(cfg)
    run_id = load_driver_state(resume).mlflow_run_id if resume is not None else None
    keys = [key for keys in CURVES.values() for key in keys]
    tracker = Tracker(cfg, cfg.trainer.experiment, cfg.trainer.run_name or "rl", stage="rl", resume_run_id=run_id,
                      history_keys=keys)
    try:
        result = trainer.fit(tracker, resume)
        result["mlflow_run_id"] = tracker.run_id  # type: ignore[assignment]
        tracker.finish()
        return result
    except BaseException:
        tracker.finish("FAILED")
        raise
    finally:
        trainer.close()


def build_trainer(cfg: Config, checkpoint: str | None = None) -> RLTrainer:
    """The trainer of ``trainer.mode``: :class:`RLTrainer` (sync) or :class:`~mmrl.trainer.async_rl.AsyncRLTrainer`."""
    if cfg.trainer.mode == "async":
        from mmrl.trainer.async_rl import AsyncRLTrainer  # it builds on this module

        return AsyncRLTrainer(cfg, checkpoint)
    return RLTrainer(cfg, checkpoint)


def check_same_tokenizer(policy: str, reward_model: str) -> None:
    """The reward model reads the policy's token ids, so both must share one vocabulary."""
    ours, theirs = (load_processor(path).tokenizer.get_vocab() for path in (policy, reward_model))
    if ours != theirs:
        raise ValueError(f"reward.model.path={reward_model} has a different tokenizer from the policy at {policy} "
                         f"({len(theirs)} vs {len(ours)} tokens, or the same sizes with other ids); train the "
                         "reward model from the policy's checkpoint (make rm, rm.init)")


def old_log_prob_source(cfg: Config) -> Literal["update", "recompute", "rollout"]:
    """Where a step's old log-probs come from (``actor.old_log_probs``), decided once for the run. ``auto``:
    ``update`` (none are sent: the update's own forward gives them) when the update is on-policy and nothing
    needs them before it (a KL penalty in the reward does, and the rollout correction), else ``recompute``."""
    if cfg.actor.rollout_correction != "none":  # its weights compare the trainer's old log-probs with the engine's
        return "recompute"
    if cfg.actor.old_log_probs == "auto":
        return "update" if on_policy(cfg.actor) and not cfg.algorithm.use_kl_in_reward else "recompute"
    return cfg.actor.old_log_probs
