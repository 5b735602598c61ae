"""Log-probabilities and entropy of response tokens under the policy.

The policy's distribution is ``softmax(logits / temperature)`` with the vision tokens banned: the
rollout engine samples from exactly that (plus optional top-p/top-k truncation, which the PPO ratio
ignores, as in verl), and this module scores tokens under exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from mmrl.models.encoding import EncodedPrompt, collate
from mmrl.models.packing import pack, worth_packing


def policy_log_softmax(logits: torch.Tensor, banned_ids: Sequence[int], temperature: float) -> torch.Tensor:
    """logits (..., V) -> log-probs (..., V) in float32, with ``banned_ids`` at -inf."""
    scaled = logits.float() / temperature
    if banned_ids:
        scaled = scaled.index_fill(-1, torch.as_tensor(banned_ids, device=scaled.device), float("-inf"))
    return F.log_softmax(scaled, dim=-1)


def gather_logprobs_entropy(log_probs: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log_probs (B, R, V), tokens (B, R) -> (token log-prob (B, R), entropy (B, R))."""
    token_logp = log_probs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    probs = log_probs.exp()
    # 0 * -inf is nan for banned tokens: their probability is exactly 0, so they add nothing.
    entropy = -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(-1)
    return token_logp, entropy


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass of prompts + responses; log-prob and entropy of each of the policy's response tokens.

    policy: a :class:`~mmrl.models.forward.PolicyForward` (possibly FSDP-sharded).
    responses, response_mask: (B, R), the mask the attention extent (holes included: the forward sees them
    as context). policy_mask: (B, R), the policy's own tokens (:mod:`mmrl.trajectory`), a subset of
    ``response_mask``; None: all of it. Returns logp (B, R) and entropy (B, R), float32, zero at holes and
    padding. Columns past the longest real response are not computed (padding is not compute).
    share_prompt: when a prompt repeats (the n samples of a prompt), run its tokens once: one packed
    sequence per distinct prompt (:mod:`mmrl.models.packing`). Gradients flow when called with grad enabled.
    """
    full_width = responses.shape[1]
    width = max(int(response_mask.sum(1).max()), 1) if len(responses) else full_width
    responses, response_mask = responses[:, :width], response_mask[:, :width]
    if share_prompt and worth_packing(prompts):
        inputs = pack(policy.core, prompts, responses, response_mask, pad_token_id)
        inputs = {k: v.to(device) for k, v in inputs.items()}
        logits = policy(inputs, 0)
    else:
        inputs = collate(prompts, pad_token_id, responses, response_mask, share_media=True)
        inputs = {k: v.to(device) for k, v in inputs.items()}
        # The logits at the last R+1 positions; the first R of them predict the response tokens.
        logits = policy(inputs, width + 1)[:, :-1]
    log_probs = policy_log_softmax(logits, banned_ids, temperature)
    logp, entropy = gather_logprobs_entropy(log_probs, responses.to(device))
    # A hole may hold a banned token (logp -inf): select, not multiply, so that no NaN appears.
    scored = ((response_mask if policy_mask is None else policy_mask[:, :width]) > 0).to(device)
    pad = (0, full_width - width)
    return (F.pad(torch.where(scored, logp, torch.zeros_like(logp)), pad),
            F.pad(torch.where(scored, entropy, torch.zeros_like(entropy)), pad))
