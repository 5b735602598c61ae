"""Rollout with a transformers model: batched, left-padded, on a full (unsharded) copy of the policy; each
prompt is prefilled once for its n samples (:mod:`mmrl.rollout.sampler`).

Two ways to hold the weights, chosen by the hybrid worker:

- shared (``owns_weights=False``): the engine runs on the actor's own module (every part replicated), so
  the weights it samples with are the trained weights by construction and nothing is copied;
- owned (``owns_weights=True``): the engine loads its own copy of the checkpoint. :meth:`update_weights`
  receives the actor's full tensors one at a time (gathered part by part from the FSDP shards) when the
  actor's weights changed; with ``rollout.free_cache_engine`` the hybrid worker calls :meth:`release`
  after a step's rollouts, which empties the parameters until the next update.

An owner of the engine may set :attr:`HFRolloutEngine.updates` (the async mode's rollout rank with
``rollout.partial``): the engine then loads newer weights between the tokens of a generation
(:mod:`mmrl.rollout.inflight`) and its outputs record each token's version. An episode's cache kept from a turn
drawn with older weights is not continued: that episode's next turn prefills its whole context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from mmrl.config import Config
from mmrl.memory.budget import (
    MicroBatching,
    ModelDims,
    budget_ranges,
    choose,
    memory_at_hand,
    parameter_bytes,
    token_budget,
)
from mmrl.models.encoding import EncodedPrompt, vision_token_ids
from mmrl.models.loading import load_model
from mmrl.perf.clock import PhaseClock
from mmrl.rollout.base import RolloutOutput, SamplingParams, check_lengths
from mmrl.rollout.inflight import InFlightUpdates
from mmrl.rollout.kept import KeptContext
from mmrl.rollout.sampler import Decoding, Sampled, sample_continuation, sample_shared_prefill


class HFRolloutEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any,
        device: torch.device,
        micro_batch_size: int = 0,
        owns_weights: bool = False,
        max_model_len: int = 0,
        max_tokens_per_micro: int = 0,
        memory_bytes: int | None = None,
    ):
        """``max_model_len``: longest prompt + response allowed; 0: the model's max_position_embeddings.
        ``micro_batch_size`` (samples) / ``max_tokens_per_micro`` (tokens) per generate call, both 0: a token
        budget sized per call from the model and ``memory_bytes``, what the engine's batches may use (None: the
        memory at hand now, :func:`mmrl.memory.budget.memory_at_hand`)."""
        self.model = model
        self.owns_weights = owns_weights
        text_config = getattr(model.config, "text_config", model.config)
        self.max_model_len = max_model_len or int(text_config.max_position_embeddings)
        self.shapes = {name: p.shape for name, p in model.named_parameters()}
        self.tokenizer = processor.tokenizer
        self.device = device
        self.micro_batch_size, self.max_tokens_per_micro = micro_batch_size, max_tokens_per_micro
        self.memory_bytes = memory_at_hand(device) if memory_bytes is None else memory_bytes
        self.dims = ModelDims.of(model)
        self.pad_id = self.tokenizer.pad_token_id
        self.eos_id = self.tokenizer.eos_token_id
        self.banned_ids = vision_token_ids(processor)
        self.updates: InFlightUpdates | None = None
        self.loads = 0  # weight loads so far: a kept cache records the one it was made with
        self.clock = PhaseClock(device)  # seconds of the vision encoding, prefill and decode since the last take

    @classmethod
    def build(
        cls, cfg: Config, checkpoint: str, processor: Any, device: torch.device, policy: torch.nn.Module | None,
        memory_bytes: int | None = None,
    ) -> HFRolloutEngine:
        """Share ``policy`` when given, else load ``checkpoint`` (see :func:`mmrl.rollout.build_rollout_engine`);
        a copy it loads comes out of ``memory_bytes`` (measured before it was loaded)."""
        owns = policy is None
        model = load_model(checkpoint, cfg.model.dtype, cfg.model.attn_implementation, device,
                           cfg.model.compile) if owns else policy
        if memory_bytes is not None and owns:
            memory_bytes -= parameter_bytes(model)
        rollout = cfg.rollout
        return cls(model, processor, device, rollout.micro_batch_size, owns_weights=owns,
                   max_model_len=rollout.max_model_len, max_tokens_per_micro=rollout.max_tokens_per_micro,
                   memory_bytes=memory_bytes)

    def batching(self, params: SamplingParams) -> MicroBatching:
        """How :meth:`generate` groups prompts: the configured samples or tokens per call, else a token budget
        for ``params``' n samples of up to ``max_new_tokens`` (:func:`mmrl.memory.budget.token_budget`)."""
        return choose(self.micro_batch_size, self.max_tokens_per_micro, lambda: token_budget(
            self.dims, self.memory_bytes, "rollout", samples_per_prompt=params.n,
            tokens_per_sample=params.max_new_tokens))

    def prompt_ranges(self, prompts: Sequence[EncodedPrompt], params: SamplingParams) -> list[tuple[int, int]]:
        """Consecutive ranges of ``prompts`` generated together: within the samples (each prompt's n) or the
        tokens (n x (prompt + max_new_tokens)) of :meth:`batching`; a prompt over it goes alone."""
        batching = self.batching(params)
        if batching.tokens:
            return budget_ranges([params.n * (len(p) + params.max_new_tokens) for p in prompts], batching.tokens)
        return budget_ranges([params.n] * len(prompts), batching.rows)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Point the engine's parameters at the given full tensors (Hugging Face names); returns the count.

        The tensors are used as they are, not copied: a freshly gathered tensor becomes the engine's,
        and a replicated actor tensor is shared. Every parameter of the model must be given.
        """
        params = dict(self.model.named_parameters())
        seen = set()
        for name, tensor in named_tensors:
            param = params.get(name)
            if param is None:
                raise ValueError(f"update_weights: the rollout model has no parameter {name!r}")
            if tensor.shape != self.shapes[name]:
                raise ValueError(f"update_weights: {name} {tuple(tensor.shape)} != {tuple(self.shapes[name])}")
            if self.owns_weights:
                param.data = tensor.to(device=self.device, dtype=param.dtype)
            seen.add(name)
        if seen != set(params):
            missing = sorted(set(params) - seen)
            raise ValueError(f"update_weights: {len(missing)} parameters were not given, e.g. {missing[:3]}")
        self.loads += 1
        return len(seen)

    def shutdown(self) -> None:
        """Nothing runs beside the module: dropping the engine frees it."""

    def release(self) -> bool:
        """Free the engine's own weights between rollouts (a no-op when it shares the actor's module)."""
        if self.owns_weights:
            for param in self.model.parameters():
                param.data = torch.empty(0, dtype=param.dtype, device=param.device)
        return self.owns_weights

    @torch.no_grad()
    def generate(self, prompts: Sequence[EncodedPrompt], params: SamplingParams, keep: bool = False) -> RolloutOutput:
        """Generate ``params.n`` responses for each prompt (sample rows grouped by prompt).

        Each prompt is prefilled once and its cache shared by its n samples (:mod:`mmrl.rollout.sampler`);
        :meth:`prompt_ranges` bounds the samples decoded together. With ``keep``, the output's ``kept`` holds
        each row's context as the model has run it, for :meth:`continue_generate`.
        """
        check_lengths(prompts, params.max_new_tokens, self.max_model_len)
        return self._joined([self._run(lambda: sample_shared_prefill(
            self.model, prompts[a:b], params.n, max_new_tokens=params.max_new_tokens, temperature=params.temperature,
            top_p=params.top_p, top_k=params.top_k, greedy=params.greedy, banned_ids=self.banned_ids,
            eos_id=self.eos_id, pad_id=self.pad_id, device=self.device, keep=keep, updates=self.updates,
            clock=self.clock),
            params.max_new_tokens) for a, b in self.prompt_ranges(prompts, params)], keep)

    @torch.no_grad()
    def continue_generate(self, contexts: Sequence[EncodedPrompt], suffixes: Sequence[EncodedPrompt],
                          kept: Sequence[KeptContext], params: SamplingParams, keep: bool = False) -> RolloutOutput:
        """One response per context (``params.n`` must be 1) whose first ``kept[i].length`` tokens the model
        ran in an earlier call (``kept`` from its output); ``suffixes[i]``: the rest of the context, with the
        media of those tokens only. Only the suffixes are prefilled (:func:`~mmrl.rollout.sampler.sample_continuation`);
        a context kept with older weights than the engine's is prefilled whole."""
        if params.n != 1:
            raise ValueError(f"continue_generate samples one continuation per context, not n={params.n}")
        stale = [i for i, k in enumerate(kept) if k.weights != self.loads]
        if stale:
            return self._stale_split(contexts, suffixes, kept, params, keep, stale)
        check_lengths(contexts, params.max_new_tokens, self.max_model_len)
        decoding = Decoding(params.max_new_tokens, params.temperature, params.top_p, params.top_k, params.greedy,
                            self.banned_ids, self.eos_id, self.pad_id)
        return self._joined([self._run(lambda: sample_continuation(
            self.model, contexts[a:b], suffixes[a:b], kept[a:b], decoding, self.device, keep, self.updates,
            self.clock),
            params.max_new_tokens) for a, b in self.prompt_ranges(contexts, params)], keep)

    def _stale_split(self, contexts: Sequence[EncodedPrompt], suffixes: Sequence[EncodedPrompt],
                     kept: Sequence[KeptContext], params: SamplingParams, keep: bool, stale: list[int]) -> RolloutOutput:
        """:meth:`continue_generate` when the rows ``stale`` were kept with older weights: those are generated from
        their whole contexts, the others continued; the output in the rows' order."""
        fresh = [i for i in range(len(contexts)) if i not in set(stale)]
        pieces = [self.generate([contexts[i] for i in stale], params, keep)]
        if fresh:
            pieces.append(self.continue_generate([contexts[i] for i in fresh], [suffixes[i] for i in fresh],
                                                 [kept[i] for i in fresh], params, keep))
        whole = self._joined(pieces, keep)
        order = torch.tensor(stale + fresh).argsort().tolist()
        return RolloutOutput(
            responses=whole.responses[order], response_mask=whole.response_mask[order],
            log_probs=whole.log_probs[order], texts=[whole.texts[i] for i in order],
            kept=[whole.kept[i] for i in order] if keep else None,
            versions=None if whole.versions is None else whole.versions[order])

    @staticmethod
    def _joined(pieces: list[RolloutOutput], keep: bool) -> RolloutOutput:
        return RolloutOutput(
            responses=torch.cat([p.responses for p in pieces]),
            response_mask=torch.cat([p.response_mask for p in pieces]),
            log_probs=torch.cat([p.log_probs for p in pieces]),
            texts=[t for p in pieces for t in p.texts],
            kept=[k for p in pieces for k in p.kept] if keep else None,
            versions=torch.cat([p.versions for p in pieces]) if all(p.versions is not None for p in pieces) else None,
        )

    def _run(self, sample: Callable[[], Sampled], width: int) -> RolloutOutput:
        """One batch of the sampler, in eval mode, as a :class:`RolloutOutput` right-padded to ``width``."""
        was_training = self.model.training
        self.model.eval()
        try:
            tokens, logp, kept, versions = sample()
        finally:
            self.model.train(was_training)
        responses, mask = self._pad_after_eos(tokens, width)
        logp = torch.nn.functional.pad(logp, (0, width - logp.shape[1])) * mask
        if versions is not None:  # padded with each row's last version: a row's oldest is its first token's
            versions = torch.cat([versions, versions[:, -1:].expand(-1, width - versions.shape[1])], dim=1)
        for k in kept or []:
            if k is not None:
                k.weights = self.loads
        texts = self.tokenizer.batch_decode(
            [row[: int(m.sum())] for row, m in zip(responses, mask)], skip_special_tokens=False
        )
        return RolloutOutput(responses=responses, response_mask=mask, log_probs=logp, texts=texts,
                             kept=kept if kept is not None else [None] * len(responses), versions=versions)

    def _pad_after_eos(self, tokens: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, L<=width) -> responses (B, width) padded after the first eos, mask (B, width)."""
        is_eos = tokens == self.eos_id
        # Positions strictly after the first eos: cumulative eos count > 0, shifted right by one.
        after_eos = torch.cumsum(is_eos.long(), dim=1) - is_eos.long() > 0
        mask = (~after_eos).float()
        responses = tokens.masked_fill(after_eos, self.pad_id)
        pad = width - tokens.shape[1]
        responses = torch.nn.functional.pad(responses, (0, pad), value=self.pad_id)
        return responses, torch.nn.functional.pad(mask, (0, pad))
