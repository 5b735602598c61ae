"""Supervised warm start: teach the answer format on a small labelled split (loss on answer tokens only).

Runs in-process (no Ray): it is a short, single-rank job. It builds inputs through the same encoding
path and log-prob function as RL, with the answer in the trained format
(:func:`mmrl.answer_format.format_answer`) followed by the end-of-turn token as the "response".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mmrl.answer_format import format_answer
from mmrl.config import Config
from mmrl.controller.worker import resolve_device
from mmrl.models.encoding import EncodedPrompt, vision_token_ids
from mmrl.models.loading import grid_pixels, load_processor, save_checkpoint
from mmrl.models.logprobs import response_logprobs
from mmrl.protocol import Batch
from mmrl.rollout import RolloutEngine, SamplingParams, build_rollout_engine
from mmrl.rollout.samples import encode_rows, generate_samples
from mmrl.tracking import Tracker
from mmrl.trainer.dataset import load_rows, rows_to_batch
from mmrl.trainer.evaluation import evaluate
from mmrl.trainer.reward_stage import RewardStage
from mmrl.trainer.supervised import train_steps
from mmrl.workers.model_builder import build_model


def target_ids(tokenizer: Any, answer: str) -> torch.Tensor:
    """The answer in the trained format, followed by the end-of-turn token; (T,) int64."""
    ids = tokenizer(format_answer(answer), add_special_tokens=False)["input_ids"]
    return torch.tensor([*ids, tokenizer.eos_token_id], dtype=torch.long)


def pad_targets(targets: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """T_i-long targets -> (B, max T) ids right-padded with ``pad_id`` and a (B, max T) float mask."""
    width = max(len(t) for t in targets)
    ids = torch.full((len(targets), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(targets), width))
    for row, target in enumerate(targets):
        ids[row, : len(target)] = target
        mask[row, : len(target)] = 1.0
    return ids, mask


class SFTTrainer:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.resources.device)
        self.init = cfg.sft.init or cfg.model.path
        self.processor = load_processor(self.init)
        torch.manual_seed(cfg.seed)
        self.layout = build_model(cfg, "actor", self.init, device=self.device, distributed=False)
        self.policy = self.layout.root
        self.model = self.policy.model  # the Hugging Face model inside
        self.engine: RolloutEngine | None = None
        self.tokenizer = self.processor.tokenizer
        self.banned = vision_token_ids(self.processor)
        rows = load_rows(cfg.data.dir, cfg.sft.split)
        self.prompts: list[EncodedPrompt] = encode_rows(self.processor, rows_to_batch(rows))
        self.targets = [target_ids(self.tokenizer, r["answer"]) for r in rows]

    def loss(self, indices: list[int]) -> torch.Tensor:
        """Mean negative log-likelihood of the target tokens of the chosen examples."""
        ids, mask = pad_targets([self.targets[i] for i in indices], self.tokenizer.pad_token_id)
        logp, _ = response_logprobs(
            self.policy, [self.prompts[i] for i in indices], ids, mask,
            pad_token_id=self.tokenizer.pad_token_id, banned_ids=self.banned, temperature=1.0, device=self.device,
            chunk_tokens=self.cfg.actor.logprob_chunk_tokens,
        )
        return -(logp.sum() / mask.to(self.device).sum())

    def train(self, tracker: Tracker) -> None:
        self.model.train()
        train_steps("sft", self.cfg.sft, self.layout.trainable(), len(self.targets), self.cfg.seed,
                    lambda indices: (self.loss(indices), {}), tracker)

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Generation with the weights being trained (an hf engine shares the module; others receive them)."""
        if self.engine is None:
            self.engine = build_rollout_engine(self.cfg, checkpoint=self.init, processor=self.processor,
                                               device=self.device, policy=self.model)
        self.engine.update_weights(self.model.named_parameters())
        return generate_samples(self.engine, self.processor, prompts, params)


def run_sft(cfg: Config) -> dict[str, Any]:
    """The ``make sft`` stage: train, report val accuracy, save ``<sft.out_dir>/checkpoint``."""
    trainer = SFTTrainer(cfg)
    tracker = Tracker(cfg, cfg.trainer.experiment, "sft", stage="sft")
    try:
        trainer.train(tracker)
        rewards = RewardStage(cfg.reward, patch_size=grid_pixels(trainer.processor))
        try:
            val = evaluate(trainer.generate, load_rows(cfg.data.dir, "val", cfg.trainer.val_size),
                           rewards.verify, cfg.eval.batch_size, cfg.eval.max_new_tokens)
        finally:
            rewards.close()
        tracker.log_metrics(val.metrics("val"), cfg.sft.steps)
        path = save_checkpoint(trainer.model, trainer.processor, Path(cfg.sft.out_dir) / "checkpoint")
        tracker.finish()
    except BaseException:
        tracker.finish("FAILED")
        raise
    finally:
        if trainer.engine is not None:
            trainer.engine.shutdown()
    print(f"sft: {val.summary()} -> {path}")
    return {"checkpoint": str(path), "val_acc": val.accuracy["all"], "mlflow_run_id": tracker.run_id}
