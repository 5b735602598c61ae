"""A rank of the async mode's rollout pool: the rollout engine alone, with a whole copy of the policy's weights.

It generates for its share of a batch's prompts, as the hybrid worker does, and loads newer weights before each
generation batch: the samples of a batch are all drawn with one weight version, which each records
(``weight_version``). With ``rollout.partial`` it also loads them inside one, between tokens
(:mod:`mmrl.rollout.inflight`: every ``rollout.partial_poll_tokens`` tokens it asks the transport), and each token
records the version that drew it (``token_versions``). The weights come from the trainer through the run's transport
(:mod:`mmrl.trainer.weight_transport`: Ray's object store; on GPUs the seam for a NCCL or CUDA-IPC broadcast):
before each batch the rank asks it for the newest version and, when it is newer than its own, loads it.

With ``rollout.agent`` its samples are episodes (:class:`~mmrl.agent.rollout.AgentRollout`, its tools' worker
processes on this rank). The rank keeps nothing of them: each sample's scoring context (the prompt with the
tool turns' media) goes back with it under its ``context_key`` (``context``), and the driver sends it on to the
one trainer rank that scores the sample (:mod:`mmrl.workers.prompts`), once per step.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from mmrl.agent.rollout import AgentRollout
from mmrl.config import Config
from mmrl.controller import Dispatch, register
from mmrl.controller.dispatch import CONTEXT, CONTEXT_KEY
from mmrl.controller.worker import Worker
from mmrl.models.encoding import EncodedPrompt
from mmrl.models.loading import load_processor
from mmrl.protocol import Batch
from mmrl.rollout import RolloutEngine, SamplingParams, build_rollout_engine
from mmrl.rollout.inflight import InFlightUpdates
from mmrl.rollout.samples import pad_samples, real_prompts, sample_encoded
from mmrl.workers.prompts import PromptCache


class RolloutWorker(Worker):
    """One rank of the rollout pool. ``generate`` takes prompt rows and returns their samples."""

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, cfg: Config, checkpoint: str, transport: Any = None) -> int:
        """The engine with ``checkpoint``'s weights (version 0); ``transport``: the run's weight transport (None:
        the rank keeps its weights until :meth:`load_weights`). Seeded as the hybrid worker of the same rank is, so
        that a run whose pool generates what the sync run's trainer would draws the same tokens. Returns the weights'
        version (0)."""
        self.cfg, self.transport = cfg, transport
        torch.manual_seed(cfg.seed + self.rank)
        self.processor = load_processor(checkpoint)
        self.engine: RolloutEngine = build_rollout_engine(cfg, checkpoint=checkpoint, processor=self.processor,
                                                          device=self.device)
        self.version = 0
        if cfg.rollout.partial:
            self.engine.updates = InFlightUpdates(self.pull_weights, lambda: self.version,
                                                  cfg.rollout.partial_poll_tokens)
        self.prompt_cache = PromptCache(self.processor)
        self.agent: AgentRollout | None = None
        if cfg.rollout.agent.enabled:
            self.agent = AgentRollout(cfg.rollout.agent, self.processor, self.engine, cfg.rollout.max_new_tokens)
            self.prompt_cache.prepare = self.agent.messages
        self.idle_since: float | None = None
        self.serial = 0  # of the agent samples this rank drew: their context keys are unique in the run
        return self.version

    @register(Dispatch.ONE_TO_ALL)
    def load_weights(self, version: int, weights: dict[str, torch.Tensor]) -> int:
        """Load ``weights`` (full tensors by Hugging Face name) as ``version``; returns the version held."""
        self.engine.update_weights(weights.items())
        self.version = version
        return self.version

    def pull_weights(self) -> bool:
        """The transport's newest weights, when they are newer than this rank's; True when they were loaded."""
        newer = self.transport.receive(self.version) if self.transport is not None else None
        if newer is not None:
            self.load_weights(*newer)
        return newer is not None

    @register(Dispatch.DP_COMPUTE, fields=("messages", "images"), prompts=True, keep_prompts=False)
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """prompts (one row per prompt) -> ``params.n`` samples per prompt, drawn with the newest weights the
        transport holds (see :func:`mmrl.rollout.samples.sample_encoded`), and ``rollout_wait_s`` (B,): on every row, how long
        this rank had nothing to generate before this call (waiting for the trainer)."""
        start = time.perf_counter()
        waited = start - self.idle_since if self.idle_since is not None else 0.0
        self.pull_weights()
        encoded = self.prompt_cache.attach(prompts, keep=False)["prompt"]
        real = real_prompts(prompts)
        if self.agent is not None:
            out = self.episodes(encoded[:real], params)
        else:
            out = sample_encoded(self.engine, encoded[:real], params, self.version)
        out = pad_samples(out, real, len(prompts), params.n)
        self.idle_since = time.perf_counter()
        out.tensors["rollout_wait_s"] = torch.full((len(out),), waited)
        return out

    def episodes(self, encoded: list[EncodedPrompt], params: SamplingParams) -> Batch:
        """The agent's samples for these prompts, each with its scoring context (``context``) under a key of its
        own (``<prompt uid>#r<rank>.<serial>``)."""
        out, contexts = self.agent.sample(encoded, params, self.version)
        names = [e.name for e in encoded for _ in range(params.n)]
        out.objects[CONTEXT_KEY] = [f"{name}#r{self.rank}.{self.serial + i}" for i, name in enumerate(names)]
        out.objects[CONTEXT] = contexts
        self.serial += len(names)
        return out

    @register(Dispatch.RANK_ZERO)
    def tool_names(self) -> list[str]:
        """The agent's tools by the names the policy calls them (none without ``rollout.agent``)."""
        return list(self.agent.table.names) if self.agent is not None else []

    def close(self) -> None:
        """End the tool worker processes (the host calls this before it drops the worker)."""
        if getattr(self, "agent", None) is not None:
            self.agent.close()

    @register(Dispatch.ONE_TO_ALL)
    def weight_version(self) -> int:
        return self.version
