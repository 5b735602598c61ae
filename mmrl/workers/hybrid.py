"""The hybrid actor / rollout / reference worker: one process holds the policy, its rollout engine and
a frozen reference copy (HybridFlow's colocated "actor-rollout-ref").
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from mmrl.config import Config
from mmrl.controller import Dispatch, Worker, register
from mmrl.models.encoding import vision_token_ids
from mmrl.models.loading import load_model, load_processor, save_checkpoint, vision_module
from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams
from mmrl.rollout.hf import HFRolloutEngine
from mmrl.rollout.prompts import generate_samples
from mmrl.workers.actor import LogProbSpec, PolicyUpdater, batched_logprobs


class ActorRolloutRefWorker(Worker):
    """One data-parallel rank of the policy. Methods take and return :class:`Batch` es."""

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, cfg: Config, checkpoint: str) -> int:
        """Load the policy (and the reference when a KL term needs it) from ``checkpoint``."""
        self.cfg = cfg
        torch.manual_seed(cfg.seed + self.rank)
        self.processor = load_processor(checkpoint)
        self.model = load_model(checkpoint, cfg.model.dtype, cfg.model.attn_implementation, self.device)
        if cfg.model.freeze_vision:
            vision_module(self.model).requires_grad_(False)
        self.reference = None
        if cfg.actor.use_kl_loss:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        tokenizer = self.processor.tokenizer
        self.spec = LogProbSpec(
            pad_token_id=tokenizer.pad_token_id,
            banned_ids=vision_token_ids(tokenizer),
            temperature=cfg.rollout.temperature,
            micro_batch_size=cfg.actor.micro_batch_size,
        )
        self.rollout = HFRolloutEngine(self.model, self.processor, self.device, cfg.rollout.micro_batch_size)
        self.updater = PolicyUpdater(self.model, cfg.actor, self.spec, self.device, self.all_reduce_sum)
        return sum(p.numel() for p in self.model.parameters())

    @register(Dispatch.DP_COMPUTE)
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """prompts (one row per prompt: messages, images) -> one row per sample (n per prompt, in order).

        Returns prompt (EncodedPrompt, shared by the n samples), responses (B*n, R), response_mask,
        rollout_log_probs and response_text.
        """
        return generate_samples(self.rollout, self.processor, prompts, params)

    @register(Dispatch.DP_COMPUTE)
    def compute_log_probs(self, batch: Batch) -> Batch:
        """-> old_log_probs (B, R) and entropy (B, R) under the current policy."""
        logp, entropy = batched_logprobs(self.model, batch, self.spec, self.device, with_entropy=True)
        return Batch(tensors={"old_log_probs": logp, "entropy": entropy})

    @register(Dispatch.DP_COMPUTE)
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """-> ref_log_probs (B, R) under the frozen reference policy."""
        if self.reference is None:
            raise RuntimeError("no reference policy was loaded: set actor.use_kl_loss=true to use one")
        logp, _ = batched_logprobs(self.reference, batch, self.spec, self.device, with_entropy=False)
        return Batch(tensors={"ref_log_probs": logp})

    @register(Dispatch.DP_COMPUTE)
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over the batch; returns metrics that are identical on every rank."""
        return self.updater.update(batch)

    @register(Dispatch.RANK_ZERO)
    def save_checkpoint(self, path: str) -> str:
        """Write the policy in Hugging Face format (rank 0 writes; every rank takes part)."""
        if self.rank == 0:
            save_checkpoint(self.model, self.processor, Path(path))
        return str(path)

    @register(Dispatch.ONE_TO_ALL)
    def state_dict_digest(self) -> dict[str, float]:
        """Sum of each parameter, per rank (a cheap fingerprint to compare ranks and runs)."""
        return {name: float(p.detach().double().sum()) for name, p in self.model.named_parameters()}
