"""The critic worker: a VLM value model with its own layout and optimizer (PPO with GAE).

The value model is the policy's backbone (vision encoder + language model, no LM head) with a scalar
head per token, initialised from a policy checkpoint (the head starts at zero). It is laid out by
``critic.vision`` / ``critic.llm`` independently of the actor.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from mmrl.algos.value_loss import value_loss
from mmrl.memory.budget import (MicroBatching, ModelDims, memory_at_hand, score_batching, sharers, training_state_bytes,
                         update_batching)
from mmrl.config import Config, CriticConfig
from mmrl.controller import Dispatch, register
from mmrl.models.encoding import collate
from mmrl.models.loading import load_processor
from mmrl.parallel.grads import AllReduce
from mmrl.parallel.sharding import Layout, full_state
from mmrl.protocol import Batch
from mmrl.trajectory import policy_mask
from mmrl.workers.micro import FILLER, micro_batches
from mmrl.workers.model_builder import build_model
from mmrl.workers.prompts import SCORED, PromptCache
from mmrl.workers.train_state import CheckpointedWorker
from mmrl.workers.update import DataParallelUpdater


def batch_values(model: torch.nn.Module, batch: Batch, pad_token_id: int, device: torch.device) -> torch.Tensor:
    """V(s_t) for every response token of ``batch``: (B, R) float32, zero on padding (grad enabled)."""
    inputs = collate(batch["prompt"], pad_token_id, batch["responses"], batch["response_mask"], share_media=True)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    values = model(inputs, batch["responses"].shape[1])
    return values * batch["response_mask"].to(device)


class ValueUpdater(DataParallelUpdater):
    """Clipped value loss against the GAE returns."""

    prefix = "critic"
    normalised = ("vf_loss",)

    def __init__(self, layout: Layout, cfg: CriticConfig, pad_token_id: int, device: torch.device,
                 all_reduce: AllReduce, micro: MicroBatching | None = None) -> None:
        super().__init__(layout, cfg, device, all_reduce, micro)
        self.pad_token_id = pad_token_id

    def update(self, batch: Batch) -> dict[str, float]:
        batch.require("prompt", "responses", "response_mask", "values", "returns")
        return super().update(batch)

    def micro_loss(self, micro: Batch, denominator: float) -> tuple[torch.Tensor, dict[str, float]]:
        dev = self.device
        mask = policy_mask(micro).to(dev)  # the values of the policy's tokens only
        values = batch_values(self.layout.root, micro, self.pad_token_id, dev)
        loss, metrics = value_loss(
            values, micro["values"].to(dev), micro["returns"].to(dev), mask,
            clip_range=self.cfg.cliprange_value, agg_mode=self.cfg.loss_agg_mode, denominator=denominator,
            horizon=self.cfg.loss_horizon,
        )
        tokens = float(mask.sum())
        return loss, {"vf_loss": float(loss.detach()), **{k: v * tokens for k, v in metrics.items()}}


class CriticWorker(CheckpointedWorker):
    """One data-parallel rank of the critic."""

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, cfg: Config, checkpoint: str) -> int:
        """Build the value model from a policy checkpoint and lay it out; returns its parameter count."""
        torch.manual_seed(cfg.seed + self.rank)
        self.cfg = cfg.critic
        processor = load_processor(checkpoint)
        self.pad_token_id = processor.tokenizer.pad_token_id
        self.prompt_cache = PromptCache(processor)
        self.layout = build_model(cfg, "critic", checkpoint, device=self.device, world_size=self.world_size)
        memory = (memory_at_hand(self.device, sharers(cfg, self.device.type, needs_critic=True))
                  - training_state_bytes(self.layout.trainable()))
        dims = ModelDims.of(self.layout.root.core, lm_head=False)
        self.batching = {
            "critic.update": update_batching(self.cfg, dims, memory),
            "critic.values": score_batching(self.cfg, dims, memory),
        }
        self.updater = ValueUpdater(self.layout, self.cfg, self.pad_token_id, self.device, self.all_reduce_sum,
                                    micro=self.batching["critic.update"])
        return sum(p.numel() for p in self.layout.root.parameters())

    @register(Dispatch.RANK_ZERO)
    def micro_batching(self) -> dict[str, str]:
        """Each pass's micro-batching (rank 0's)."""
        return {name: str(b) for name, b in self.batching.items()}

    @register(Dispatch.DP_COMPUTE, fields=SCORED, optional=("policy_mask",), prompts=True)
    def compute_values(self, batch: Batch) -> Batch:
        """-> values (B, R): the critic's V(s_t) before each response token."""
        batch = self.prompt_cache.attach(batch)
        out = []
        with torch.no_grad():
            values_micro = self.batching["critic.values"]
            for micro in micro_batches(batch, values_micro.rows, values_micro.tokens, False, self.all_reduce_sum):
                values = batch_values(self.layout.root, micro, self.pad_token_id, self.device).cpu()
                if not micro.meta.get(FILLER):
                    out.append(values)
        return Batch(tensors={"values": torch.cat(out)})

    @register(Dispatch.DP_COMPUTE, fields=(*SCORED, "values", "returns"), optional=("policy_mask",), prompts=True)
    def update_critic(self, batch: Batch) -> dict[str, float]:
        """Value-loss epochs over the batch (values = rollout-time values, returns = GAE targets); the metrics
        hold the group's peak memory of the step so far."""
        return self.updater.update(self.prompt_cache.attach(batch)) | self.memory_metrics("critic")

    @register(Dispatch.RANK_ZERO)
    def save_checkpoint(self, path: str) -> str:
        """Write the value model's full weights as ``<path>/value_model.safetensors`` (rank 0 writes)."""
        state = {name: t.detach().cpu().contiguous() for name, t in full_state(self.layout.root)}
        if self.rank == 0:
            folder = Path(path)
            folder.mkdir(parents=True, exist_ok=True)
            save_file(state, str(folder / "value_model.safetensors"))
        return str(path)
