"""Log-probabilities and entropy of response tokens under the policy.

The policy's distribution is ``softmax(logits / temperature)`` with the vision tokens banned: the
rollout engine samples from exactly that (plus optional top-p/top-k truncation, which the PPO ratio
ignores, as in verl), and this module scores tokens under exactly that. :func:`policy_log_softmax` is the
one-step form the sampler uses on (B, V) logits; :func:`response_logprobs` scores whole responses through
:class:`~mmrl.models.forward.PolicyForward`, which applies the head in chunks of tokens
(:mod:`mmrl.models.scoring`) and never forms (B, R, V) logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from mmrl.models.encoding import EncodedPrompt, collate
from mmrl.models.packing import pack, worth_packing
from mmrl.models.scoring import Scoring


def policy_log_softmax(logits: torch.Tensor, banned_ids: Sequence[int], temperature: float) -> torch.Tensor:
    """logits (..., V) -> log-probs (..., V) in float32, with ``banned_ids`` at -inf."""
    scaled = logits.float() / temperature
    if banned_ids:
        scaled = scaled.index_fill(-1, torch.as_tensor(banned_ids, device=scaled.device), float("-inf"))
    return F.log_softmax(scaled, dim=-1)


def response_logprobs(
    policy: torch.nn.Module,
    prompts: Sequence[EncodedPrompt],
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    pad_token_id: int,
    banned_ids: Sequence[int],
    temperature: float,
    device: torch.device,
    share_prompt: bool = False,
    policy_mask: torch.Tensor | None = None,
    with_entropy: bool = False,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward pass of prompts + responses; log-prob (and entropy) of each of the policy's response tokens.

    policy: a :class:`~mmrl.models.forward.PolicyForward` (possibly FSDP-sharded).
    responses, response_mask: (B, R), the mask the attention extent (holes included: the forward sees them
    as context). policy_mask: (B, R), the policy's own tokens (:mod:`mmrl.trajectory`), a subset of
    ``response_mask``; None: all of it. Only the policy's tokens are scored: the LM head runs on their hidden
    states alone, chunk_tokens at a time (0: automatic, :func:`mmrl.models.scoring.chunk_size`).
    Returns logp (B, R) and entropy (B, R) (None unless ``with_entropy``), float32, zero at holes and padding.
    Columns past the longest real response are not computed (padding is not compute).
    share_prompt: when a prompt repeats (the n samples of a prompt), run its tokens once: one flat packed
    sequence of the distinct prompts and their responses (:mod:`mmrl.models.packing`). Gradients flow when called with grad enabled.
    """
    full_width = responses.shape[1]
    width = max(int(response_mask.sum(1).max()), 1) if len(responses) else full_width
    responses, response_mask = responses[:, :width], response_mask[:, :width]
    if share_prompt and worth_packing(prompts):
        inputs = pack(policy.core, prompts, responses, response_mask, pad_token_id)
    else:
        inputs = collate(prompts, pad_token_id, responses, response_mask, share_media=True)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    scored = (response_mask if policy_mask is None else policy_mask[:, :width] * response_mask) > 0
    scoring = Scoring(temperature, tuple(banned_ids), with_entropy, chunk_tokens)
    logp, entropy = policy(inputs, responses.to(device), scored.to(device), scoring)
    pad = (0, full_width - width)
    return F.pad(logp, pad), None if entropy is None else F.pad(entropy, pad)
