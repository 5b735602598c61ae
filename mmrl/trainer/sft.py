"""Supervised warm start: teach the answer format on a small labelled split (loss on answer tokens only).

Runs in-process (no Ray): it is a short, single-rank job. It builds inputs through the same encoding
path and log-prob function as RL, with the answer in the trained format
(:func:`mmrl.answer_format.format_answer`) followed by the end-of-turn token as the "response".

With ``rollout.agent.enabled`` every prompt carries the tools in its system message, as in RL, and a row that
holds a demonstrated episode (assistant calls, tool turns, the answer: :mod:`mmrl.agent.demonstrations`) is
trained on its assistant turns only; its tool turns are context.
"""

from __future__ import annotations

import json
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
from mmrl.rollout.samples import encode_row, encode_rows, generate_samples
from mmrl.trainer.tracking import Tracker
from mmrl.trainer.dataset import load_rows, rows_to_batch
from mmrl.trainer.evaluation import evaluate
from mmrl.trainer.reward_stage import RewardStage
from mmrl.trainer.supervised import train_steps
from mmrl.workers.model_builder import build_model


def target_ids(tokenizer: Any, answer: str) -> torch.Tensor:
    """The answer in the trained format, followed by the end-of-turn token; (T,) int64."""
    return response_ids(tokenizer, format_answer(answer))


def response_ids(tokenizer: Any, text: str) -> torch.Tensor:
    """A response's text as the policy would end it: its tokens, then the end-of-turn token; (T,) int64."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
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


def agent_examples(processor: Any, cfg: Config, rows: list[dict[str, Any]]
                   ) -> list[tuple[EncodedPrompt, torch.Tensor, torch.Tensor]]:
    """The SFT examples of an agent run: a demonstration row's episode (its assistant turns trained, but those
    its ``extra["context_messages"]`` lists), any other row's prompt with the tools in its system message and its
    answer as the target."""
    from mmrl.agent.chat import ChatFormat
    from mmrl.agent.demonstrations import encode_demonstration, is_demonstration
    from mmrl.agent.executor import ToolExecutor
    from mmrl.agent.table import build_tool_table
    from mmrl.schema import decode_image

    chat = ChatFormat(processor)
    with ToolExecutor(isolation="inline") as describer:  # the tools' schemas only: nothing is called
        tools = build_tool_table(cfg.rollout.agent.tools, describer).definitions()
    examples = []
    for row in rows:
        images = [decode_image(b) for b in row["images"]]
        name = str(row["id"])
        if is_demonstration(row["messages"]):
            context = json.loads(row.get("extra") or "{}").get("context_messages", [])
            episode = encode_demonstration(chat, tools, row["messages"], images, name, context)
            response = episode.response()
            examples.append((episode.scoring_context(), response["ids"], response["policy_mask"]))
        else:
            messages = chat.with_tools(chat.in_format(row["messages"]), tools)
            target = target_ids(processor.tokenizer, row["answer"])
            prompt = encode_row(processor, messages, row["images"], row.get("videos"), name)
            examples.append((prompt, target, torch.ones(len(target))))
    return examples


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
        self.agent = None  # the agent loop of the evaluation (rollout.agent), built with the engine
        self.tokenizer = self.processor.tokenizer
        self.banned = vision_token_ids(self.processor)
        rows = load_rows(cfg.data.dir, cfg.sft.split)
        # Per example: its prompt (a demonstration's scoring context), the target ids (T,) and which of them
        # are trained on (T,) (a demonstration's tool turns are not).
        self.examples: list[tuple[EncodedPrompt, torch.Tensor, torch.Tensor]] = (
            agent_examples(self.processor, cfg, rows) if cfg.rollout.agent.enabled else
            [(p, t, torch.ones(len(t))) for p, t in zip(encode_rows(self.processor, rows_to_batch(rows)),
                                                        (target_ids(self.tokenizer, r["answer"]) for r in rows))])

    def loss(self, indices: list[int]) -> torch.Tensor:
        """Mean negative log-likelihood of the trained target tokens of the chosen examples."""
        chosen = [self.examples[i] for i in indices]
        ids, mask = pad_targets([t for _, t, _ in chosen], self.tokenizer.pad_token_id)
        trained, _ = pad_targets([m for _, _, m in chosen], 0)
        trained = trained * mask
        logp, _ = response_logprobs(
            self.policy, [p for p, _, _ in chosen], ids, mask,
            pad_token_id=self.tokenizer.pad_token_id, banned_ids=self.banned, temperature=1.0, device=self.device,
            chunk_tokens=self.cfg.actor.logprob_chunk_tokens, policy_mask=trained,
        )
        return -(logp.sum() / trained.to(self.device).sum())

    def train(self, tracker: Tracker) -> None:
        self.model.train()
        train_steps("sft", self.cfg.sft, self.layout.trainable(), len(self.examples), self.cfg.seed,
                    lambda indices: (self.loss(indices), {}), tracker)

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Generation with the weights being trained (an hf engine shares the module; others receive them)."""
        if self.engine is None:
            self.engine = build_rollout_engine(self.cfg, checkpoint=self.init, processor=self.processor,
                                               device=self.device, policy=self.model)
        self.engine.update_weights(self.model.named_parameters())
        if not self.cfg.rollout.agent.enabled:
            return generate_samples(self.engine, self.processor, prompts, params)
        if self.agent is None:
            from mmrl.agent.rollout import AgentRollout

            self.agent = AgentRollout(self.cfg.rollout.agent, self.processor, self.engine, params.max_new_tokens)
        return self.agent.generate(prompts, params)

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()


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
        trainer.close()
        if trainer.engine is not None:
            trainer.engine.shutdown()
    print(f"sft: {val.summary()} -> {path}")
    return {"checkpoint": str(path), "val_acc": val.accuracy["all"], "mlflow_run_id": tracker.run_id}
