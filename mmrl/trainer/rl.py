"""The RL driver: one controller program over the hybrid actor/rollout/reference worker group (and the
critic group when the algorithm needs one).

One step, as in design.md::

    prompts -> generate n responses -> rewards -> the algorithm's filter -> old (and ref) log-probs
    -> (critic values) -> the algorithm's advantages -> (critic update) -> actor update

What differs between algorithms is read from the algorithm object (:mod:`mmrl.algos`), never from its name.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from mmrl.algos import build_algorithm, needs_reference
from mmrl.config import Config
from mmrl.controller import ResourcePool, WorkerGroup
from mmrl.controller.session import ensure_ray, worker_shape
from mmrl.controller.worker import resolve_device
from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams
from mmrl.tracking import Tracker, console_line
from mmrl.trainer.dataset import PromptLoader, load_rows
from mmrl.trainer.evaluation import EvalResult, evaluate, samples_html, samples_table
from mmrl.trainer.plots import plot_curves
from mmrl.trainer.reward_stage import Verifier, build_reward_stage, place_on_last_token
from mmrl.workers.critic import CriticWorker
from mmrl.workers.hybrid import ActorRolloutRefWorker

log = logging.getLogger(__name__)

CONSOLE = {"critic/score/mean": "score", "train/acc": "acc", "val/acc": "val_acc", "actor/pg_loss": "pg_loss",
           "actor/entropy": "entropy", "response_length/mean": "resp_len", "timing_s/step": "step_s"}
CURVES = {
    "reward": ["critic/score/mean", "train/acc"],
    "accuracy": ["val/acc"],
    "policy": ["actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac"],
    "critic": ["critic/vf_loss", "critic/vf_explained_var"],
}


class RLTrainer:
    def __init__(self, cfg: Config, checkpoint: str | None = None) -> None:
        self.cfg = cfg
        self.checkpoint = checkpoint or cfg.trainer.init
        self.algorithm = build_algorithm(cfg)
        self.with_reference = needs_reference(cfg)
        self.sampling = SamplingParams(
            n=cfg.rollout.n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k, max_new_tokens=cfg.rollout.max_new_tokens,
        )
        self.reward = build_reward_stage(cfg.reward)
        self.verifier = Verifier(cfg.reward)
        self.train_rows = load_rows(cfg.data.dir, "train")
        self.val_rows = load_rows(cfg.data.dir, "val", limit=cfg.trainer.val_size)
        self.timing: dict[str, float] = {}

    # ---- set-up -------------------------------------------------------------------------------

    def build_workers(self) -> None:
        """The actor-rollout-ref group, and the critic group when the algorithm needs one (colocated on
        the actor's pool, or on its own)."""
        res = self.cfg.resources
        ensure_ray(res)
        use_gpu = resolve_device(res.device).type == "cuda"
        with_critic = self.algorithm.needs_critic
        separate = with_critic and self.cfg.critic.placement == "separate"
        cpus, threads = worker_shape(res, use_gpu, pools=2 if separate else 1)
        pool = ResourcePool(res.num_workers, cpus, use_gpu, name="actor_rollout_ref")
        share = 0.5 if with_critic and not separate else 1.0
        self.workers = WorkerGroup(ActorRolloutRefWorker, pool, threads=threads, device=res.device, share=share)
        self.workers.init_model(self.cfg, self.checkpoint, self.with_reference)
        self.critic: WorkerGroup | None = None
        if with_critic:
            critic_pool = ResourcePool(res.num_workers, cpus, use_gpu, name="critic") if separate else pool
            self.critic = WorkerGroup(CriticWorker, critic_pool, threads=threads, device=res.device, share=share)
            self.critic.init_model(self.cfg, self.cfg.critic.init or self.checkpoint)

    # ---- the loop -----------------------------------------------------------------------------

    def fit(self, tracker: Tracker) -> dict[str, float]:
        """Run ``trainer.steps`` steps; evaluate every ``eval_every``; save the final checkpoint."""
        cfg = self.cfg.trainer
        self.build_workers()
        loader = iter(PromptLoader(self.train_rows, cfg.prompts_per_step, self.cfg.seed))
        last_eval: dict[str, float] = {}
        for step in range(1, cfg.steps + 1):
            metrics = self.step(next(loader))
            evaluate_now = (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps
            if evaluate_now:
                last_eval = self.validate(tracker, step)
                metrics.update(last_eval)
            tracker.log_metrics(metrics, step)
            if evaluate_now:
                self.log_curves(tracker)  # refreshed at every evaluation, so a live run shows its curves
            print(console_line(step, cfg.steps, metrics, CONSOLE), flush=True)
        path = self.workers.save_checkpoint(str(Path(cfg.out_dir) / "checkpoint"))
        tracker.log_text(path, "checkpoint_path.txt")
        if self.critic is not None:
            self.critic.save_checkpoint(str(Path(cfg.out_dir) / "critic"))
        return last_eval

    def step(self, prompts: Batch) -> dict[str, float]:
        """One RL step on a Batch of prompts; returns its metrics."""
        self.timing = {}
        with self.timer("step"):
            with self.timer("gen"):
                batch = prompts.repeat(self.sampling.n).union(self.workers.generate(prompts, self.sampling))
            with self.timer("reward"):
                batch, metrics = self.score(batch)
            batch, filter_metrics = self.algorithm.filter(batch)
            with self.timer("old_log_prob"):
                batch = batch.union(self.workers.compute_log_probs(batch))
            if self.with_reference:
                with self.timer("ref"):
                    batch = batch.union(self.workers.compute_ref_log_probs(batch))
            if self.critic is not None:
                with self.timer("values"):
                    batch = batch.union(self.critic.compute_values(batch))
            with self.timer("adv"):
                batch = batch.union(self.algorithm.compute_advantages(batch))
            if self.critic is not None:
                with self.timer("update_critic"):
                    metrics |= self.critic.update_critic(batch)[0]
            with self.timer("update_actor"):
                metrics |= self.workers.update_actor(batch)[0]
        metrics |= filter_metrics | self.step_metrics(batch) | self.value_metrics(batch)
        return metrics | self.timing_metrics(batch)

    def score(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """The reward stage's scores as ``token_level_rewards`` (on each response's last token), the
        reward metrics and the verifier's ``train/acc``."""
        scores, metrics = self.reward.score(batch)
        batch.tensors["token_level_rewards"] = place_on_last_token(scores, batch["response_mask"])
        correct = self.verifier.correct(batch)
        metrics["train/acc"] = sum(correct) / len(correct)
        return batch, metrics

    @staticmethod
    def value_metrics(batch: Batch) -> dict[str, float]:
        """Value and return statistics, and the explained variance of the returns by the values."""
        if "values" not in batch.tensors:
            return {}
        mask = batch["response_mask"].bool()
        values, returns = batch["values"][mask], batch["returns"][mask]
        var = returns.var(unbiased=False)
        explained = 1 - (returns - values).var(unbiased=False) / var if var > 0 else torch.tensor(float("nan"))
        return {
            "critic/values/mean": float(values.mean()),
            "critic/returns/mean": float(returns.mean()),
            "critic/vf_explained_var": float(explained),
        }

    @staticmethod
    def step_metrics(batch: Batch) -> dict[str, float]:
        """Score, advantage (over valid tokens) and length statistics, and the rollout/trainer agreement."""
        mask = batch["response_mask"]
        lengths = mask.sum(-1)
        scores = batch["token_level_rewards"].sum(-1)
        adv = batch["advantages"][mask.bool()]
        return {
            "critic/score/mean": float(scores.mean()),
            "critic/score/max": float(scores.max()),
            "critic/score/min": float(scores.min()),
            "critic/advantages/mean": float(adv.mean()),
            "critic/advantages/max": float(adv.max()),
            "critic/advantages/min": float(adv.min()),
            "response_length/mean": float(lengths.float().mean()),
            "response_length/max": float(lengths.max()),
            "response_length/clip_ratio": float((lengths >= mask.shape[1]).float().mean()),
            "actor/entropy_old": float((batch["entropy"] * mask).sum() / mask.sum()),
            "rollout/logprob_diff_max": float(((batch["rollout_log_probs"] - batch["old_log_probs"]).abs() * mask).max()),
        }

    def timing_metrics(self, batch: Batch) -> dict[str, float]:
        tokens = float(batch["response_mask"].sum()) + sum(len(p) for p in batch["prompt"])
        metrics = {f"timing_s/{k}": v for k, v in self.timing.items()}
        metrics["perf/throughput"] = tokens / self.timing["step"] / self.workers.world_size
        metrics["perf/total_num_tokens"] = tokens
        return metrics

    @contextmanager
    def timer(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.timing[name] = time.perf_counter() - start

    # ---- evaluation and artifacts -------------------------------------------------------------

    def validate(self, tracker: Tracker, step: int) -> dict[str, float]:
        with self.timer("val"):
            result: EvalResult = evaluate(self.workers.generate, self.val_rows, self.verifier,
                                          self.cfg.eval.batch_size, self.cfg.rollout.max_new_tokens)
        tracker.log_dict(samples_table(result.samples), f"rollouts/step_{step:05d}.json")
        tracker.log_text(samples_html(result.samples, f"val rollouts at step {step}"), f"rollouts/step_{step:05d}.html")
        return result.metrics("val") | {"timing_s/val": self.timing["val"]}

    def log_curves(self, tracker: Tracker) -> None:
        panels = {title: keys for title, keys in CURVES.items() if any(k in tracker.history for k in keys)}
        figure = plot_curves(tracker.history, panels)
        tracker.log_figure(figure, "curves.png")

    def shutdown(self) -> None:
        for group in (getattr(self, "critic", None), getattr(self, "workers", None)):
            if group is not None:
                group.shutdown()


def run_rl(cfg: Config) -> dict[str, float]:
    """The ``make rl`` stage: train, log to MLflow, save ``<trainer.out_dir>/checkpoint``."""
    trainer = RLTrainer(cfg)
    tracker = Tracker(cfg, cfg.trainer.experiment, cfg.trainer.run_name or "rl", stage="rl")
    try:
        result = trainer.fit(tracker)
        result["mlflow_run_id"] = tracker.run_id  # type: ignore[assignment]
        tracker.finish()
        return result
    except BaseException:
        tracker.finish("FAILED")
        raise
    finally:
        trainer.shutdown()
