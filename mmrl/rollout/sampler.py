"""Sampling with a shared prefill: each distinct prompt is prefilled once (one vision pass, one pass over its
tokens) and its KV cache is repeated for its n samples, which then decode together.

``transformers.generate`` with n samples per prompt repeats the prompt n times before the prefill, so the
vision tower and the prompt tokens run n times. Here the prefill runs on the distinct prompts only. The
decode loop is a plain one (no logits-processor stack): per step, the policy's distribution
(:func:`~mmrl.models.logprobs.policy_log_softmax`: temperature, vision tokens banned), optional top-k / top-p
truncation for the draw, and one forward of the new tokens with the cache. Positions are the model family's
(:meth:`~mmrl.models.families.base.Family.positions`): a generated token j sits at the prompt's largest
position + 1 + j on every axis. The vision tower runs once per prefill (:func:`~mmrl.models.forward.encode_media`,
the training forward's path), its features handed to the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmrl.models.encoding import EncodedPrompt, collate
from mmrl.models.families import family_of
from mmrl.models.forward import core_model, encode_media, text_inputs
from mmrl.models.logprobs import policy_log_softmax


def truncate(log_probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """log_probs (B, V) -> the same with the tokens outside the top-k and the top-p nucleus at -inf.

    top_k 0 and top_p 1 keep everything. The nucleus is the smallest set of most likely tokens whose
    probability reaches top_p (the most likely token is always kept).
    """
    if top_k > 0 and top_k < log_probs.shape[-1]:
        kth = log_probs.topk(top_k, dim=-1).values[:, -1:]
        log_probs = log_probs.masked_fill(log_probs < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logp, order = log_probs.sort(dim=-1, descending=True)
        before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()  # probability of the tokens ranked above
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        log_probs = log_probs.masked_fill(drop, float("-inf"))
    return log_probs


def draw(log_probs: torch.Tensor, greedy: bool, top_k: int, top_p: float) -> torch.Tensor:
    """log_probs (B, V) -> tokens (B,): the argmax, or a sample from the truncated distribution."""
    if greedy:
        return log_probs.argmax(-1)
    probs = truncate(log_probs, top_k, top_p).exp()
    return torch.multinomial(probs, 1).squeeze(-1)


@torch.no_grad()
def sample_shared_prefill(
    model: torch.nn.Module,
    prompts: Sequence[EncodedPrompt],
    n: int,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    greedy: bool,
    banned_ids: Sequence[int],
    eos_id: int,
    pad_id: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """n samples for each of the G distinct ``prompts`` (rows grouped by prompt).

    Returns tokens (G*n, L) int64, L <= max_new_tokens (the loop stops once every row has emitted eos;
    tokens after a row's eos are the pad id), and their log-probs (G*n, L) float32 under the policy's
    distribution at ``temperature`` (1 when greedy), untruncated.
    """
    core = core_model(model)
    family = family_of(core.config)
    inputs = {k: v.to(device) for k, v in collate(prompts, pad_id).items()}
    positions = family.positions(core, inputs)  # (A, G, P)
    media, _ = encode_media(core, inputs, always=False)
    out = model(**text_inputs(inputs), mm_encoder_outputs=media or None, position_ids=family.model_positions(positions),
                use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    cache.batch_repeat_interleave(n)
    logits = out.logits[:, -1].repeat_interleave(n, dim=0)
    attention = inputs["attention_mask"].repeat_interleave(n, dim=0)
    next_position = (positions.amax(dim=(0, 2)) + 1).repeat_interleave(n)  # (G*n,)
    scale = 1.0 if greedy else temperature
    finished = torch.zeros(len(logits), dtype=torch.bool, device=device)
    tokens, log_probs = [], []
    for step in range(max_new_tokens):
        logp = policy_log_softmax(logits, banned_ids, scale)
        token = draw(logp, greedy, top_k, top_p)
        token = token.masked_fill(finished, pad_id)
        tokens.append(token)
        log_probs.append(logp.gather(-1, token[:, None]).squeeze(-1).masked_fill(finished, 0.0))
        finished |= token == eos_id
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        attention = torch.cat([attention, (~finished).long()[:, None]], dim=1)
        position = (next_position + step).view(1, -1, 1).expand(family.position_axes, -1, -1)
        logits = model(input_ids=token[:, None], attention_mask=attention, position_ids=family.model_positions(position),
                       past_key_values=cache, use_cache=True).logits[:, -1]
    return torch.stack(tokens, dim=1).cpu(), torch.stack(log_probs, dim=1).float().cpu()
