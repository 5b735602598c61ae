"""The hybrid actor / rollout / reference worker: one process holds the policy, its rollout engine and
a frozen reference copy (HybridFlow's colocated "actor-rollout-ref").

The actor and the reference are laid out by ``actor.vision`` / ``actor.llm`` (replicated or FSDP2
sharded). The rollout engine (``rollout.engine``) needs full weights: an hf engine runs on the actor's own
module when every part is replicated; otherwise the engine holds its own copy, which receives the gathered
weights (Hugging Face names) before each rollout and frees them after it. Checkpoints are written from
the same gathered state, never from the engine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from mmrl.algos import needs_reference, policy_loss
from mmrl.config import Config
from mmrl.controller import Dispatch, register
from mmrl.models.encoding import vision_token_ids
from mmrl.models.loading import load_processor, save_checkpoint
from mmrl.models.weights import to_hf_names
from mmrl.parallel.sharding import full_state
from mmrl.protocol import Batch
from mmrl.rollout import RolloutEngine, SamplingParams, build_rollout_engine
from mmrl.rollout.samples import generate_samples
from mmrl.workers.actor import LogProbSpec, PolicyUpdater, batched_logprobs
from mmrl.workers.model_builder import build_model
from mmrl.workers.train_state import CheckpointedWorker

SCORED = ("prompt", "responses", "response_mask")  # what every log-prob pass reads


class ActorRolloutRefWorker(CheckpointedWorker):
    """One data-parallel rank of the policy. Methods take and return :class:`Batch` es."""

    @register(Dispatch.ONE_TO_ALL)
    def init_model(
        self, cfg: Config, checkpoint: str, with_reference: bool | None = None, with_rollout: bool = True
    ) -> int:
        """Load the policy (and the reference when the run needs it) from ``checkpoint``; lay them out.

        ``with_reference`` defaults to :func:`mmrl.algos.needs_reference`; ``with_rollout=False`` builds a
        trainer-only worker (no rollout engine: ``generate`` is unavailable; for benchmarks).
        Returns the number of parameters of the full model.
        """
        self.cfg = cfg
        torch.manual_seed(cfg.seed + self.rank)
        self.processor = load_processor(checkpoint)
        build = dict(device=self.device, world_size=self.world_size)
        self.actor = build_model(cfg, "actor", checkpoint, **build)
        use_reference = needs_reference(cfg) if with_reference is None else with_reference
        self.reference = build_model(cfg, "reference", checkpoint, **build) if use_reference else None
        self.rollout: RolloutEngine | None = None
        if with_rollout:
            shared = None if self.actor.is_sharded else self.actor.root.model
            self.rollout = build_rollout_engine(
                cfg, checkpoint=checkpoint, processor=self.processor, device=self.device, policy=shared
            )
            self.rollout.release()
        tokenizer = self.processor.tokenizer
        self.spec = LogProbSpec(
            pad_token_id=tokenizer.pad_token_id,
            banned_ids=vision_token_ids(tokenizer),
            temperature=cfg.rollout.temperature,
            micro_batch_size=cfg.actor.micro_batch_size,
            max_tokens_per_micro=cfg.actor.max_tokens_per_micro,
            share_prompt=cfg.actor.share_prompt and cfg.model.attn_implementation != "flash_attention_2",
        )
        self.updater = PolicyUpdater(
            self.actor, cfg.actor, policy_loss(cfg), self.spec, self.device, self.all_reduce_sum
        )
        return sum(p.numel() for p in self.actor.root.parameters())

    def hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The actor's full tensors with Hugging Face names, one at a time (all ranks iterate in step)."""
        return to_hf_names(full_state(self.actor.root))

    @contextmanager
    def weights_in_engine(self) -> Iterator[RolloutEngine]:
        """The rollout engine holding the actor's current weights, for as long as the block runs."""
        if self.rollout is None:
            raise RuntimeError("this worker was built with with_rollout=False: it has no rollout engine")
        self.rollout.update_weights(self.hf_weights())
        try:
            yield self.rollout
        finally:
            self.rollout.release()

    @register(Dispatch.DP_COMPUTE, fields=("messages", "images"), optional=("videos", "uid"))
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """prompts (one row per prompt: messages, images) -> one row per sample (n per prompt, in order).

        Returns prompt (EncodedPrompt, shared by the n samples), responses (B*n, R), response_mask,
        rollout_log_probs and response_text.
        """
        with self.weights_in_engine() as engine:
            return generate_samples(engine, self.processor, prompts, params)

    @register(Dispatch.ONE_TO_ALL)
    def time_weight_update(self) -> float:
        """Seconds to hand the actor's current weights to the rollout engine and release them (benchmarks)."""
        start = time.perf_counter()
        with self.weights_in_engine():
            pass
        return time.perf_counter() - start

    @register(Dispatch.DP_COMPUTE, fields=SCORED)
    def compute_log_probs(self, batch: Batch) -> Batch:
        """-> old_log_probs (B, R) and entropy (B, R) under the current policy."""
        logp, entropy = batched_logprobs(self.actor.root, batch, self.spec, self.device, True, self.all_reduce_sum)
        return Batch(tensors={"old_log_probs": logp, "entropy": entropy})

    @register(Dispatch.DP_COMPUTE, fields=SCORED)
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """-> ref_log_probs (B, R) under the frozen reference policy."""
        if self.reference is None:
            raise RuntimeError("no reference policy was loaded: set actor.use_kl_loss=true to use one")
        logp, _ = batched_logprobs(self.reference.root, batch, self.spec, self.device, False, self.all_reduce_sum)
        return Batch(tensors={"ref_log_probs": logp})

    @register(Dispatch.DP_COMPUTE, fields=(*SCORED, "advantages"), optional=("old_log_probs", "ref_log_probs", "correct"))
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over the batch; returns metrics that are identical on every rank."""
        return self.updater.update(batch)

    @register(Dispatch.RANK_ZERO)
    def save_checkpoint(self, path: str) -> str:
        """Write the policy as a Hugging Face checkpoint: every rank gathers, rank 0 writes."""
        state = {}
        for name, tensor in self.hf_weights():
            if self.rank == 0:
                state[name] = tensor.cpu()
        if self.rank == 0:
            save_checkpoint(self.actor.root.model, self.processor, Path(path), state)
        return str(path)

    @register(Dispatch.ONE_TO_ALL)
    def full_state_dict(self, part: str = "all") -> dict[str, torch.Tensor]:
        """Copies of the full parameters (``part``: all | vision | llm), Hugging Face names; for tests."""
        out = {}
        for name, tensor in self.hf_weights():
            is_vision = ".visual." in f".{name}"
            if part == "all" or (part == "vision") == is_vision:
                out[name] = tensor.detach().cpu().clone()
        return out

    @register(Dispatch.ONE_TO_ALL)
    def layout_report(self) -> dict[str, object]:
        """What this rank holds: parameter kinds, optimizer-state owners and gradients (for tests)."""
        visual = self.actor.root.core.visual
        vision_ids = {id(p) for p in visual.parameters()}
        state_owners = [id(p) for p in self.updater.optimizer.state]
        return {
            "sharded": len(self.actor.sharded),
            "replicated": len(self.actor.replicated),
            "vision_params_with_optimizer_state": sum(i in vision_ids for i in state_owners),
            "params_with_optimizer_state": len(state_owners),
            "vision_params_with_grad": sum(p.grad is not None for p in visual.parameters()),
            "rollout_params_held": self._rollout_params_held(),
        }

    def _rollout_params_held(self) -> int:
        """Elements an hf rollout engine holds on its own (-1: it shares the actor's module, or is not hf)."""
        from mmrl.rollout.hf import HFRolloutEngine

        if not isinstance(self.rollout, HFRolloutEngine) or not self.rollout.owns_weights:
            return -1
        return sum(p.numel() for p in self.rollout.model.parameters())
