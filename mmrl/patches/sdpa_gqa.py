"""Grouped-query attention in torch's SDPA on CPU, with a mask, instead of copying the keys and values per head.

Why: transformers' SDPA attention passes ``enable_gqa`` to torch only without an attention mask (the CUDA kernels
that are fast take no mask with it); with one it first repeats every key and value head for its group of query
heads (``repeat_kv``): a copy of the whole KV cache per layer per decoded token. Every mmrl forward has a mask
(left-padded prompts, packed rows). On CPU, torch's SDPA takes ``enable_gqa`` with a mask, and the copy was the
largest operator of the hf engine's decode (112 of 568 ms of a 64 x 8 x 32 rollout on the bench model, 2 cores);
SDPA with ``enable_gqa`` took 1.0 ms where repeat + SDPA took 3.4 ms at 512 rows x 80 keys.

What: :func:`apply` wraps ``transformers.integrations.sdpa_attention.use_gqa_in_sdpa`` so that it also says yes for
keys on the CPU (whose SDPA supports it with a mask); elsewhere the original decides. Equal to the repeated heads'
attention, forward and backward (tests/unit/test_sdpa_gqa.py).

One query token (a decode step) on the CPU goes further (:func:`decode_attention`): the query heads that share a
key head are folded into the query length, (B, h, 1, d) -> (B, kv, h / kv, d), and the attention is two batched
matrix products and a softmax. torch's CPU flash kernel runs one small block per (row, head) with a fixed cost
each; at 512 rows x 51 keys (4 query heads on 2 key heads, head size 32) it took 5.4 ms where the two products
took 1.1 ms, and the products stay ahead at 128 x 300 (1.2 against 2.1 ms) and 64 x 2048 keys (5.6 against 6.3
ms). A decode step's scores are (B, h, L), the size of one layer's keys over the head size, so nothing large is
held. :func:`apply` registers :func:`sdpa_attention` as transformers' ``sdpa`` attention function for that.
Prefill and training forwards (many query tokens) keep torch's kernel, which is the faster there and never holds
the (queries, keys) scores.
"""

from __future__ import annotations

from typing import Any

import torch

ORIGINAL: dict[str, Any] = {}


def use_gqa_in_sdpa(attention_mask: torch.Tensor | None, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether transformers' SDPA attention passes ``enable_gqa`` instead of repeating the key and value heads."""
    if key.device.type == "cpu" and key.shape[-1] == value.shape[-1]:
        return True
    return ORIGINAL["use_gqa_in_sdpa"](attention_mask, key, value)


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """Attention of a few query tokens per key head as batched matrix products.

    query (B, kv, g, d), key and value (B, kv, L, d), mask None, bool (True: attend) or additive, broadcastable to
    (B, kv, g, L) -> (B, kv, g, d). The softmax runs in float32 whatever the inputs' dtype.
    """
    scores = torch.matmul(query, key.transpose(-1, -2)).float().mul_(scale)
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf")) if mask.dtype == torch.bool else scores.add_(mask)
    return torch.matmul(scores.softmax(-1).to(value.dtype), value)


def sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention; one query token on the CPU (a decode step) runs :func:`decode_attention`, each
    group of query heads folded into the query length. query (B, h, 1, d), key and value (B, kv, L, d),
    attention_mask None or (B, 1, 1, L) -> (B, 1, h, d)."""
    batch, heads, length, dim = query.shape
    groups = heads // key.shape[1]
    mask_per_row = attention_mask is None or (attention_mask.dim() == 4 and attention_mask.shape[1:3] == (1, 1))
    if length != 1 or query.device.type != "cpu" or not mask_per_row or args or kwargs.get("dropout"):
        return ORIGINAL["sdpa_attention_forward"](module, query, key, value, attention_mask, *args, **kwargs)
    scale = kwargs.get("scaling") or dim**-0.5
    folded = query.reshape(batch, key.shape[1], groups, dim)
    out = decode_attention(folded, key, value, attention_mask, scale)
    return out.reshape(batch, 1, heads, dim), None


def apply() -> None:
    """Install :func:`use_gqa_in_sdpa` and :func:`sdpa_attention` (idempotent)."""
    from transformers.integrations import sdpa_attention as module
    from transformers.modeling_utils import AttentionInterface

    if module.use_gqa_in_sdpa is not use_gqa_in_sdpa:
        ORIGINAL["use_gqa_in_sdpa"] = module.use_gqa_in_sdpa
        module.use_gqa_in_sdpa = use_gqa_in_sdpa
    if "sdpa_attention_forward" not in ORIGINAL:
        ORIGINAL["sdpa_attention_forward"] = module.sdpa_attention_forward
        AttentionInterface.register("sdpa", sdpa_attention)
