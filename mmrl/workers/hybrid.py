"""The hybrid actor / rollout / reference worker: one process holds the policy, its rollout engine and
a frozen reference copy (HybridFlow's colocated "actor-rollout-ref").

The actor and the reference are laid out by ``actor.vision`` / ``actor.llm`` (replicated or FSDP2
sharded). The rollout engine needs full weights: when every part is replicated it runs on the actor's
own module; otherwise it owns an empty skeleton that receives the gathered weights before each rollout
and frees them after it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from mmrl.config import Config
from mmrl.controller import Dispatch, Worker, register
from mmrl.models.encoding import vision_token_ids
from mmrl.models.forward import PolicyForward
from mmrl.models.loading import load_model, load_processor, save_checkpoint, vision_module
from mmrl.parallel.sharding import Layout, full_state, shard_parts
from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams
from mmrl.rollout.hf import HFRolloutEngine
from mmrl.rollout.prompts import generate_samples
from mmrl.workers.actor import LogProbSpec, PolicyUpdater, batched_logprobs

PREFIX = "model."  # PolicyForward's name for the Hugging Face model


class ActorRolloutRefWorker(Worker):
    """One data-parallel rank of the policy. Methods take and return :class:`Batch` es."""

    @register(Dispatch.ONE_TO_ALL)
    def init_model(
        self, cfg: Config, checkpoint: str, with_reference: bool | None = None, with_rollout: bool = True
    ) -> int:
        """Load the policy (and the reference when a KL term needs it) from ``checkpoint``; lay them out.

        ``with_reference`` defaults to ``actor.use_kl_loss``; ``with_rollout=False`` builds a trainer-only
        worker (no rollout engine: ``generate`` and ``save_checkpoint`` are unavailable; for benchmarks).
        Returns the number of parameters of the full model.
        """
        self.cfg = cfg
        torch.manual_seed(cfg.seed + self.rank)
        self.processor = load_processor(checkpoint)
        model = load_model(checkpoint, cfg.model.dtype, cfg.model.attn_implementation, self.device)
        if cfg.actor.vision.freeze:
            vision_module(model).requires_grad_(False)
        num_params = sum(p.numel() for p in model.parameters())
        sharded = any(part.strategy != "replicate" for part in (cfg.actor.vision, cfg.actor.llm))
        # Copies are taken before sharding replaces the parameters with their shards.
        rollout_model = copy.deepcopy(model) if sharded and with_rollout else model
        if with_reference is None:
            with_reference = cfg.actor.use_kl_loss
        self.reference: Layout | None = None
        if with_reference:
            reference = copy.deepcopy(model).eval().requires_grad_(False)
            self.reference = self._lay_out(reference)
        self.actor = self._lay_out(model)
        self.rollout = HFRolloutEngine(rollout_model, self.processor, self.device, cfg.rollout.micro_batch_size,
                                       owns_weights=sharded) if with_rollout else None
        if self.rollout is not None:
            self.rollout.release()
        tokenizer = self.processor.tokenizer
        self.spec = LogProbSpec(
            pad_token_id=tokenizer.pad_token_id,
            banned_ids=vision_token_ids(tokenizer),
            temperature=cfg.rollout.temperature,
            micro_batch_size=cfg.actor.micro_batch_size,
        )
        self.updater = PolicyUpdater(self.actor, cfg.actor, self.spec, self.device, self.all_reduce_sum)
        return num_params

    def _lay_out(self, model: torch.nn.Module) -> Layout:
        return shard_parts(PolicyForward(model), self.cfg.actor.vision, self.cfg.actor.llm, self.world_size,
                           self.device)

    @contextmanager
    def full_weights(self) -> Iterator[torch.nn.Module]:
        """The policy as one full Hugging Face model, for as long as the block runs (all ranks enter)."""
        if self.rollout is None:
            raise RuntimeError("this worker was built with with_rollout=False: it has no rollout engine")
        self.rollout.update_weights(full_state(self.actor.root, PREFIX))
        try:
            yield self.rollout.model
        finally:
            self.rollout.release()

    @register(Dispatch.DP_COMPUTE)
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """prompts (one row per prompt: messages, images) -> one row per sample (n per prompt, in order).

        Returns prompt (EncodedPrompt, shared by the n samples), responses (B*n, R), response_mask,
        rollout_log_probs and response_text.
        """
        with self.full_weights():
            return generate_samples(self.rollout, self.processor, prompts, params)

    @register(Dispatch.DP_COMPUTE)
    def compute_log_probs(self, batch: Batch) -> Batch:
        """-> old_log_probs (B, R) and entropy (B, R) under the current policy."""
        logp, entropy = batched_logprobs(self.actor.root, batch, self.spec, self.device, with_entropy=True)
        return Batch(tensors={"old_log_probs": logp, "entropy": entropy})

    @register(Dispatch.DP_COMPUTE)
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """-> ref_log_probs (B, R) under the frozen reference policy."""
        if self.reference is None:
            raise RuntimeError("no reference policy was loaded: set actor.use_kl_loss=true to use one")
        logp, _ = batched_logprobs(self.reference.root, batch, self.spec, self.device, with_entropy=False)
        return Batch(tensors={"ref_log_probs": logp})

    @register(Dispatch.DP_COMPUTE)
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over the batch; returns metrics that are identical on every rank."""
        return self.updater.update(batch)

    @register(Dispatch.RANK_ZERO)
    def save_checkpoint(self, path: str) -> str:
        """Write the policy in Hugging Face format (every rank gathers; rank 0 writes)."""
        with self.full_weights() as model:
            if self.rank == 0:
                save_checkpoint(model, self.processor, Path(path))
        return str(path)

    @register(Dispatch.ONE_TO_ALL)
    def full_state_dict(self, part: str = "all") -> dict[str, torch.Tensor]:
        """Copies of the full parameters (``part``: all | vision | llm), Hugging Face names; for tests."""
        out = {}
        for name, tensor in full_state(self.actor.root, PREFIX):
            is_vision = ".visual." in f".{name}"
            if part == "all" or (part == "vision") == is_vision:
                out[name] = tensor.detach().cpu().clone()
        return out

    @register(Dispatch.ONE_TO_ALL)
    def layout_report(self) -> dict[str, object]:
        """What this rank holds: parameter kinds, optimizer-state owners and gradients (for tests)."""
        vision_ids = {id(p) for p in vision_module(self.actor.root.model).parameters()}
        state_owners = [id(p) for p in self.updater.optimizer.state]
        return {
            "sharded": len(self.actor.sharded),
            "replicated": len(self.actor.replicated),
            "vision_params_with_optimizer_state": sum(i in vision_ids for i in state_owners),
            "params_with_optimizer_state": len(state_owners),
            "vision_params_with_grad": sum(p.grad is not None for p in vision_module(self.actor.root.model).parameters()),
            "rollout_params_held": self._rollout_params_held(),
        }

    def _rollout_params_held(self) -> int:
        """Elements the rollout engine holds on its own (-1: none of its own, it shares the actor's)."""
        if self.rollout is None or not self.rollout.owns_weights:
            return -1
        return sum(p.numel() for p in self.rollout.model.parameters())
