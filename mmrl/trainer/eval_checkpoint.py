"""The ``make eval`` stage: greedy accuracy of a checkpoint on a split, per data_source, in-process.

With ``rollout.agent.enabled`` each prompt is an episode with the run's tools (as RL rolls out), and the run also
logs how the episodes used them (:mod:`mmrl.agent.scorecard`); ``rollout.agent.enabled=false`` evaluates the
same checkpoint without tools.
"""

from __future__ import annotations

from typing import Any

from mmrl.config import Config
from mmrl.controller.worker import resolve_device
from mmrl.models.loading import grid_pixels, load_processor
from mmrl.protocol import Batch
from mmrl.rollout import SamplingParams, build_rollout_engine
from mmrl.rollout.samples import generate_samples
from mmrl.trainer.tracking import Tracker
from mmrl.trainer.dataset import load_rows
from mmrl.trainer.evaluation import EvalResult, evaluate, samples_html, samples_table
from mmrl.trainer.reward_stage import RewardStage


def evaluate_checkpoint(cfg: Config, checkpoint: str, split: str) -> EvalResult:
    """Greedy answers of ``checkpoint`` (through the configured rollout engine) on ``split``, verified."""
    device = resolve_device(cfg.resources.device)
    processor = load_processor(checkpoint)
    engine = build_rollout_engine(cfg, checkpoint=checkpoint, processor=processor, device=device)
    agent = None
    if cfg.rollout.agent.enabled:
        from mmrl.agent.rollout import AgentRollout

        agent = AgentRollout(cfg.rollout.agent, processor, engine, cfg.eval.max_new_tokens)

    def generate(prompts: Batch, params: SamplingParams) -> Batch:
        if agent is not None:
            return agent.generate(prompts, params)
        return generate_samples(engine, processor, prompts, params)

    rows = load_rows(cfg.data.dir, split)
    rewards = RewardStage(cfg.reward, patch_size=grid_pixels(processor))
    try:
        return evaluate(generate, rows, rewards.verify, cfg.eval.batch_size, cfg.eval.max_new_tokens)
    finally:
        rewards.close()
        if agent is not None:
            agent.close()
        engine.shutdown()


def run_eval(cfg: Config, checkpoint: str | None = None, run_name: str = "") -> dict[str, Any]:
    checkpoint = checkpoint or cfg.eval.checkpoint
    result = evaluate_checkpoint(cfg, checkpoint, cfg.eval.split)
    tracker = Tracker(cfg, cfg.trainer.experiment, run_name or cfg.eval.run_name or "eval", stage="eval")
    tracker.log_metrics(result.metrics(cfg.eval.split), step=0)
    tracker.log_table(result.table(), f"eval/{cfg.eval.split}_accuracy_by_source.json")
    tracker.log_dict(samples_table(result.samples), f"rollouts/{cfg.eval.split}.json")
    tracker.log_text(samples_html(result.samples, f"{checkpoint} on {cfg.eval.split}"), f"rollouts/{cfg.eval.split}.html")
    tracker.log_text(checkpoint, "checkpoint_path.txt")
    tracker.finish()
    print(f"eval {checkpoint} on {cfg.eval.split}: {result.summary()}")
    return {"accuracy": result.accuracy, "counts": result.counts, "mlflow_run_id": tracker.run_id,
            "tool_use": result.tool_use.metrics("agent") if result.tool_use is not None else {}}
