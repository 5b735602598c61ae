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


def apply() -> None:
    """Install :func:`use_gqa_in_sdpa` (idempotent)."""
    from transformers.integrations import sdpa_attention

    if sdpa_attention.use_gqa_in_sdpa is not use_gqa_in_sdpa:
        ORIGINAL["use_gqa_in_sdpa"] = sdpa_attention.use_gqa_in_sdpa
        sdpa_attention.use_gqa_in_sdpa = use_gqa_in_sdpa
