"""The hybrid actor / rollout / reference worker: one process holds the policy, its rollout engine and
a frozen reference copy (HybridFlow's colocated "actor-rollout-ref"). With LoRA (``actor.lora.rank`` > 0) the
policy is the frozen base plus trained adapters, and the reference is that base with the adapters off: no copy.

The actor and the reference are laid out by ``actor.vision`` / ``actor.llm`` (replicated or FSDP2
sharded). The rollout engine (``rollout.engine``) needs full weights: an hf engine runs on the actor's own
module when every part is replicated (and there are no LoRA adapters); otherwise the engine holds its own copy,
which receives the merged weights (:meth:`hf_weights`).

**Weight versions.** The actor's weights carry a version, 0 at load, that each ``update_actor`` increments.
The engine's copy carries the version it was loaded with. :meth:`sync_weights` (the driver's
``update_weights`` stage) gathers the actor's full tensors and loads them into the engine only when the two
differ, so the rollouts, evaluation batches and extra generation rounds of one step share one sync. With
``rollout.free_cache_engine`` the driver calls :meth:`release_engine` after the step's rollouts: an engine that
then frees its weights (an hf copy; vLLM's sleep mode, GPU only) holds no version until the next
``sync_weights(wake=True)``. Every sample records the version it was sampled with (``weight_version``).
Checkpoints are written from the same gathered state, never from the engine.

**Prompts.** Each rank keeps the encodings of the prompts it generated for (:class:`PromptCache`): the
log-prob passes and the update receive uids, not pixels.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from mmrl.agent.rollout import AgentRollout
from mmrl.algos import ALGORITHMS, LOSSES, needs_reference, policy_loss
from mmrl.algos.rollout_correction import IS_WEIGHTS
from mmrl.config import Config
from mmrl.controller import Dispatch, register
from mmrl.controller.dispatch import CONTEXT, CONTEXT_KEY
from mmrl.memory.budget import (
    MicroBatching,
    ModelDims,
    memory_at_hand,
    score_batching,
    sharers,
    training_state_bytes,
    update_batching,
)
from mmrl.models.encoding import vision_token_ids
from mmrl.models.loading import load_processor, save_checkpoint
from mmrl.models.lora import (
    ADAPTER_DIR,
    adapter_state,
    adapter_tensors,
    adapters_off,
    export_config,
    has_lora,
    lora_layers,
    merged_state,
    save_adapters,
)
from mmrl.models.weights import to_hf_names
from mmrl.parallel.sharding import full_state
from mmrl.protocol import Batch
from mmrl.rollout import RolloutEngine, SamplingParams, build_rollout_engine
from mmrl.rollout.samples import pad_samples, real_prompts, sample_encoded
from mmrl.workers.actor import LogProbSpec, PolicyUpdater, batched_logprobs
from mmrl.workers.model_builder import build_model
from mmrl.workers.prompts import SCORED, PromptCache
from mmrl.workers.train_state import CheckpointedWorker

# The per-sample fields any loss of the table may read beyond advantages (each loss's spec declares its own).
LOSS_FIELDS = tuple(sorted({field for spec in LOSSES.values() for field in spec.fields}))


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
        self.checkpoint = checkpoint
        build = dict(device=self.device, world_size=self.world_size)
        lora = cfg.actor.lora.rank > 0
        self.actor = build_model(cfg, "lora_actor" if lora else "actor", checkpoint, **build)
        self.use_reference = needs_reference(cfg) if with_reference is None else with_reference
        # With LoRA the reference is the actor's own base, its adapters off (reference_policy): no second copy.
        self.reference = build_model(cfg, "reference", checkpoint, **build) if self.use_reference and not lora else None
        self.rollout: RolloutEngine | None = None
        self.version = 0  # of the actor's weights: +1 per update
        self.engine_version: int | None = 0  # of the engine's weights (loaded from the same checkpoint); None: freed
        self.agent: AgentRollout | None = None
        self.prompt_cache = PromptCache(self.processor)
        if with_rollout:
            # An hf engine runs on a replicated actor's own module, but not on one with LoRA adapters: it holds
            # the merged weights (of the adapted layers; the others are the actor's tensors), which generate faster.
            shared = None if self.actor.is_sharded or lora else self.actor.root.model
            self.rollout = build_rollout_engine(
                cfg, checkpoint=checkpoint, processor=self.processor, device=self.device, policy=shared,
                memory_bytes=self.memory_for_passes(),
            )
            self.release_engine()
            if cfg.rollout.agent.enabled:
                self.agent = AgentRollout(cfg.rollout.agent, self.processor, self.rollout, cfg.rollout.max_new_tokens)
                self.prompt_cache.prepare = self.agent.messages
        self.batching = self.size_batches()
        tokenizer = self.processor.tokenizer
        self.spec = LogProbSpec(
            pad_token_id=tokenizer.pad_token_id,
            banned_ids=vision_token_ids(self.processor),
            temperature=cfg.rollout.temperature,
            micro_batch_size=self.batching["actor.log_probs"].rows,
            max_tokens_per_micro=self.batching["actor.log_probs"].tokens,
            share_prompt=cfg.actor.share_prompt and cfg.model.attn_implementation != "flash_attention_2",
            chunk_tokens=cfg.actor.logprob_chunk_tokens,
        )
        self.updater = PolicyUpdater(self.actor, cfg.actor, policy_loss(cfg), self.spec, self.device,
                                     self.all_reduce_sum, micro=self.batching["actor.update"])
        return sum(p.numel() for p in self.actor.root.parameters())

    def size_batches(self) -> dict[str, MicroBatching | None]:
        """Each pass's micro-batching: the config's settings, else token budgets for the memory left once the
        models and the engine are in place (what the engine keeps between rollouts is not free)."""
        memory, dims, cfg = self.memory_for_passes(), ModelDims.of(self.actor.root.core), self.cfg
        batching = {"actor.update": update_batching(cfg.actor, dims, memory),
                    "actor.log_probs": score_batching(cfg.actor, dims, memory)}
        if self.rollout is not None:
            batching["rollout.generate"] = self.rollout.batching(SamplingParams(
                n=cfg.rollout.n, max_new_tokens=cfg.rollout.max_new_tokens))
        return batching

    def memory_for_passes(self) -> int:
        """Bytes this rank's passes may use: its share of the memory at hand, less the gradients and AdamW state
        the actor's optimizer has yet to allocate (:mod:`mmrl.memory.budget`)."""
        share = sharers(self.cfg, self.device.type, ALGORITHMS[self.cfg.algorithm.name].needs_critic)
        return memory_at_hand(self.device, share) - training_state_bytes(self.actor.trainable())

    @register(Dispatch.RANK_ZERO)
    def micro_batching(self) -> dict[str, str]:
        """Each pass's micro-batching (rank 0's; an automatic budget may differ a little between ranks)."""
        return {name: str(b) if b is not None else "the engine's own" for name, b in self.batching.items()}

    def hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The actor's full tensors with Hugging Face names, one at a time (all ranks iterate in step); LoRA
        adapters are merged into new tensors under the base model's names (:func:`mmrl.models.lora.merged_state`)."""
        root = self.actor.root
        return to_hf_names(merged_state(lora_layers(root), full_state(root)))

    @contextmanager
    def reference_policy(self) -> Iterator[torch.nn.Module]:
        """The frozen KL reference: its own copy, or with LoRA the actor with its adapters off."""
        if not self.use_reference:
            raise RuntimeError("no reference policy was loaded: set actor.use_kl_loss=true to use one")
        if self.reference is not None:
            yield self.reference.root
        else:
            with adapters_off(self.actor.root) as base:
                yield base

    # ---- the rollout engine's weights ---------------------------------------------------------

    def engine(self) -> RolloutEngine:
        if self.rollout is None:
            raise RuntimeError("this worker was built with with_rollout=False: it has no rollout engine")
        return self.rollout

    @register(Dispatch.ONE_TO_ALL)
    def sync_weights(self, wake: bool = True) -> int:
        """Load the actor's weights into the rollout engine when its version is behind; an engine whose
        weights were freed is loaded only with ``wake``. Returns 1 when weights were loaded, else 0 (every
        rank takes the same decision: the versions move in step)."""
        engine = self.engine()
        if self.engine_version == self.version or (self.engine_version is None and not wake):
            return 0
        engine.update_weights(self.hf_weights())
        self.engine_version = self.version
        return 1

    @register(Dispatch.RANK_ZERO)
    def publish_weights(self, transport: Any) -> int:
        """The async mode's weight hand-off: every rank gathers the actor's full tensors (a collective) and gives
        them to ``transport`` (:mod:`mmrl.trainer.weight_transport`) under the actor's version, which it returns."""
        transport.send(self.version, self.hf_weights(), self.rank)
        return self.version

    @register(Dispatch.ONE_TO_ALL)
    def release_engine(self) -> None:
        """After a step's rollouts: with ``rollout.free_cache_engine``, the engine frees what it can (an hf
        engine its own copy of the weights, vLLM its KV cache and weights where it can sleep). A worker without an
        engine has nothing to free."""
        if self.rollout is not None and self.cfg.rollout.free_cache_engine and self.rollout.release():
            self.engine_version = None

    @register(Dispatch.ONE_TO_ALL)
    def drop_prompts(self) -> None:
        """A new step (see :meth:`Worker.drop_prompts`); the engine's phase clock starts again, so a step's
        :meth:`rollout_seconds` leave out the validation between steps."""
        super().drop_prompts()
        self.rollout_seconds()

    @register(Dispatch.ONE_TO_ALL)
    def rollout_seconds(self) -> dict[str, float]:
        """The engine's seconds per phase (``vision``, ``prefill``, ``decode``) since the last call; empty for an
        engine that does not time them (vLLM's, which runs its own scheduler)."""
        clock = getattr(self.rollout, "clock", None)
        return clock.take() if clock is not None else {}

    def rollout_batch(self, prompts: Batch, params: SamplingParams, keep: bool, return_prompts: bool,
                      share_contexts: bool = False) -> Batch:
        """n samples per prompt row. The dispatcher's padding rows (copies of this rank's last prompt) are not
        generated for: they get copies of the last real prompt's samples, which the driver drops."""
        encoded = self.prompt_cache.attach(prompts, keep=keep)["prompt"]
        self.sync_weights(wake=True)  # a no-op after the driver's update_weights stage
        real = real_prompts(prompts)
        if self.agent is not None:
            out = self.episodes(encoded[:real], params, keep, return_prompts, share_contexts)
        else:
            out = sample_encoded(self.engine(), encoded[:real], params, self.version, with_prompts=return_prompts)
        return pad_samples(out, real, len(prompts), params.n)

    def episodes(self, encoded: list, params: SamplingParams, keep: bool, return_prompts: bool,
                 share_contexts: bool) -> Batch:
        """The agent's samples for these prompts; with ``keep`` the rank holds each sample's scoring context
        under its ``context_key`` (``<prompt uid>#<serial>``: unique on the rank, whatever rounds the step
        takes) for the step's later calls, and with ``share_contexts`` also returns them (``context``) for the
        other groups that score the samples (a critic's)."""
        out, contexts = self.agent.sample(encoded, params, self.version)
        if keep:
            self.hold_contexts(out, contexts, share_contexts)
        if return_prompts:
            out.objects["prompt"] = contexts
        return out

    def hold_contexts(self, samples: Batch, contexts: list, share_contexts: bool) -> None:
        """Keep agent samples' scoring contexts under their new ``context_key`` (in ``samples``); with
        ``share_contexts`` the contexts go back too."""
        first = len(self.prompt_cache)
        keys = [f"{c.name}#{first + i}" for i, c in enumerate(contexts)]
        self.prompt_cache.hold(keys, contexts)
        samples.objects[CONTEXT_KEY] = keys
        if share_contexts:
            samples.objects[CONTEXT] = contexts

    @register(Dispatch.DP_COMPUTE, fields=("guide_turns",), prompts=True)
    def guide_episodes(self, rows: Batch, share_contexts: bool = False) -> Batch:
        """rows (one per guide: the uid of a prompt this step generated for, ``guide_turns``: the texts of its
        policy turns) -> one guide episode each, run with the rank's real tools (:meth:`AgentRollout.guide`):
        the agent's sample fields with ``guide_complete`` (B,) and ``context_key``, whose scoring context the rank
        holds for the step's later passes (and returns with ``share_contexts``)."""
        if self.agent is None:
            raise RuntimeError("guide_episodes runs agent episodes: this worker has no agent (rollout.agent.enabled)")
        encoded = self.prompt_cache.attach(rows)["prompt"]
        real = real_prompts(rows)
        out, contexts = self.agent.guide(encoded[:real], rows["guide_turns"][:real], self.version)
        self.hold_contexts(out, contexts, share_contexts)
        return pad_samples(out, real, len(rows), 1)

    @register(Dispatch.RANK_ZERO)
    def tool_names(self) -> list[str]:
        """The agent's tools by the names the policy calls them (none without ``rollout.agent``)."""
        return list(self.agent.table.names) if self.agent is not None else []

    def close(self) -> None:
        """End the tool worker processes (the host calls this before it drops the worker)."""
        if self.agent is not None:
            self.agent.close()

    @register(Dispatch.DP_COMPUTE, fields=("messages", "images"), prompts=True)
    def generate(self, prompts: Batch, params: SamplingParams, return_prompts: bool = False,
                 share_contexts: bool = False) -> Batch:
        """prompts (one row per prompt: uid, messages, images, videos) -> one row per sample (n per prompt,
        in order): see :func:`mmrl.rollout.samples.sample_encoded`. The rank keeps the prompts' encodings for
        the step's later calls; ``return_prompts`` also sends them back (a ``make bench`` baseline);
        ``share_contexts`` sends agent episodes' scoring contexts back, for the other groups (a critic's)."""
        return self.rollout_batch(prompts, params, keep=True, return_prompts=return_prompts,
                                  share_contexts=share_contexts)

    @register(Dispatch.DP_COMPUTE, fields=("messages", "images"), prompts=True, keep_prompts=False)
    def generate_once(self, prompts: Batch, params: SamplingParams) -> Batch:
        """:meth:`generate` for prompts no later call needs (evaluation): their encodings are not kept."""
        return self.rollout_batch(prompts, params, keep=False, return_prompts=False)

    # ---- log-probs and the update -------------------------------------------------------------

    @register(Dispatch.DP_COMPUTE, fields=SCORED, optional=("policy_mask",), prompts=True)
    def compute_log_probs(self, batch: Batch) -> Batch:
        """-> old_log_probs (B, R) and entropy (B, R) under the current policy."""
        batch = self.prompt_cache.attach(batch)
        logp, entropy = batched_logprobs(self.actor.root, batch, self.spec, self.device, True, self.all_reduce_sum)
        return Batch(tensors={"old_log_probs": logp, "entropy": entropy})

    @register(Dispatch.DP_COMPUTE, fields=SCORED, optional=("policy_mask",), prompts=True)
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """-> ref_log_probs (B, R) under the frozen reference policy (:meth:`reference_policy`)."""
        batch = self.prompt_cache.attach(batch)
        with self.reference_policy() as reference:
            logp, _ = batched_logprobs(reference, batch, self.spec, self.device, False, self.all_reduce_sum)
        return Batch(tensors={"ref_log_probs": logp})

    @register(Dispatch.DP_COMPUTE, fields=(*SCORED, "advantages"),
              optional=("policy_mask", "old_log_probs", "ref_log_probs", IS_WEIGHTS, *LOSS_FIELDS),
              prompts=True)
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over the batch; returns metrics that are identical on every rank, the group's peak memory
        of the step so far among them. The weights' version moves on by one."""
        metrics = self.updater.update(self.prompt_cache.attach(batch))
        self.version += 1
        return metrics | {"actor/weight_version": float(self.version)} | self.memory_metrics("actor")

    @register(Dispatch.ONE_TO_ALL)
    def save_state(self, folder: str) -> None:
        """The training state (see :class:`CheckpointedWorker`) and the weights' version."""
        super().save_state(folder)
        if self.rank == 0:
            (Path(folder) / "weight_version.json").write_text(json.dumps({"version": self.version}))

    @register(Dispatch.ONE_TO_ALL)
    def load_state(self, folder: str) -> None:
        """Load the training state and its version; the engine's copy is then stale (synced before the next
        rollout)."""
        super().load_state(folder)
        saved = Path(folder) / "weight_version.json"
        self.version = json.loads(saved.read_text())["version"] if saved.is_file() else self.version + 1
        if self.engine_version is not None:
            self.engine_version = -1

    @register(Dispatch.RANK_ZERO)
    def save_checkpoint(self, path: str) -> str:
        """Write the policy as a Hugging Face checkpoint: every rank gathers, rank 0 writes. With LoRA the
        checkpoint holds the merged weights, and ``<path>/adapter`` peft's adapter folder (over the base at the
        checkpoint the actor was built from)."""
        state = {}
        for name, tensor in self.hf_weights():
            if self.rank == 0:
                state[name] = tensor.cpu()
        model = self.actor.root.model
        adapters = adapter_state(to_hf_names(adapter_tensors(self.actor.root))) if has_lora(model) else None
        if self.rank == 0:
            save_checkpoint(model, self.processor, Path(path), state)
            if adapters is not None:
                save_adapters(Path(path) / ADAPTER_DIR, adapters, export_config(model, self.cfg.actor.lora),
                              self.checkpoint)
        return str(path)
