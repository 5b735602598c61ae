"""The interface every rollout engine implements."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from mmrl.memory.budget import MicroBatching
from mmrl.models.encoding import EncodedPrompt
from mmrl.rollout.sampling import SamplingParams


@dataclass
class RolloutOutput:
    """Responses for B*n samples (the n samples of prompt i at rows i*n .. i*n+n-1).

    responses: (B*n, R) int64, right-padded with the pad id, R = max_new_tokens;
    response_mask: (B*n, R) float32, 1 up to and including the eos token;
    log_probs: (B*n, R) float32 under the sampling distribution (temperature, vision tokens banned);
    kept: when the engine was asked to keep them, per row what it keeps of the row's context for the row's next
    turn (an engine's own handle, None for a row it kept nothing of); None otherwise;
    versions: with in-flight weight updates (:mod:`mmrl.rollout.inflight`), (B*n, R) int64, the weights' version
    that drew each token; None when the whole call ran on one version.
    """

    responses: torch.Tensor
    response_mask: torch.Tensor
    log_probs: torch.Tensor
    texts: list[str]
    kept: list[Any] | None = None
    versions: torch.Tensor | None = None


class PromptTooLong(ValueError):
    """A prompt that cannot fit in the engine's context with its response."""


def check_lengths(prompts: Sequence[EncodedPrompt], max_new_tokens: int, max_model_len: int) -> None:
    """Raise :class:`PromptTooLong` naming the first prompt whose tokens plus ``max_new_tokens`` exceed
    ``max_model_len`` (before anything is generated)."""
    for prompt in prompts:
        if len(prompt) + max_new_tokens > max_model_len:
            raise PromptTooLong(
                f"prompt {prompt.name or '(unnamed)'} has {len(prompt)} tokens (image tokens included); with "
                f"rollout.max_new_tokens={max_new_tokens} it exceeds the engine's limit of {max_model_len} "
                "(rollout.max_model_len); drop or shorten it (make data quarantines prompts over "
                "data.max_prompt_tokens) or raise rollout.max_model_len"
            )


class RolloutEngine(Protocol):
    """An engine may also continue contexts it has run (the hf engine: ``generate(..., keep=True)`` fills the
    output's ``kept``, ``continue_generate`` runs only what follows them); the agent loop uses that where it
    exists (:mod:`mmrl.agent.loop`)."""

    def generate(self, prompts: Sequence[EncodedPrompt], params: SamplingParams) -> RolloutOutput: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load the trainer's current weights (Hugging Face names, full tensors, streamed one at a time)."""
        ...

    def release(self) -> bool:
        """Free what the engine can between rollouts; True when that dropped its weights (the next rollout
        needs :meth:`update_weights` first)."""
        ...

    def shutdown(self) -> None:
        """Stop the engine for good (an in-process engine then holds nothing)."""
        ...

    def batching(self, params: SamplingParams) -> MicroBatching | None:
        """How :meth:`generate` cuts a call with ``params`` into batches; None where the engine schedules its
        own."""
        ...
