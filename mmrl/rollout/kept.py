"""The model's work on an episode's context, kept from one policy turn to the next (the hf engine).

After a policy turn the engine's KV cache holds every token of the row's context but the turn's last one (the
end-of-turn token was drawn, never run). :func:`keep_rows` copies each row's part out of the batch's cache,
without its padding: a :class:`KeptContext` of the first ``length`` tokens of the context. The next turn's
context is that prefix plus a suffix (the end-of-turn token, the tool turn, its images), so the next prefill
runs on the suffix only: the vision tower on the new images, the language model on the new tokens, attending
to the kept keys and values (:func:`joined` lays the kept rows of a batch side by side, left-padded).

Only caches made of plain full-attention layers are kept (a sliding-window or recurrent layer does not hold
every token), and only within a byte budget: the agent loop drops what does not fit and prefills those
episodes whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass(eq=False)
class KeptContext:
    """One row's cache: per layer, keys and values (H, C, D) of the first C = ``length`` tokens of its context;
    ``weights``: which of the engine's weight loads made it (a cache of older weights is not continued)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    weights: int = 0

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[1])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


def keepable(cache: object) -> bool:
    """Whether every layer of ``cache`` holds every token (plain full attention) and can be kept."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer).__name__ in ("DynamicLayer", "ReservedLayer") for layer in layers)


def keep_rows(cache: DynamicCache, attention: torch.Tensor, ends: Sequence[int | None]) -> list[KeptContext | None]:
    """Each row's tokens out of a batch's cache.

    cache: per layer keys and values (B, H, W, D); attention: (B, >= W) int, 1 on the row's real tokens;
    ends: per row, the cache columns ``[0, end)`` it keeps (the real ones among them), None: keep nothing.
    Returns per row a :class:`KeptContext` (copies, so that the batch's cache can be freed) or None.
    """
    kept: list[KeptContext | None] = []
    for row, end in enumerate(ends):
        if end is None:
            kept.append(None)
            continue
        columns = attention[row, :end].nonzero().squeeze(-1).to(cache.layers[0].keys.device)
        kept.append(KeptContext([layer.keys[row].index_select(1, columns) for layer in cache.layers],
                                [layer.values[row].index_select(1, columns) for layer in cache.layers]))
    return kept


def joined(kept: Sequence[KeptContext], device: torch.device) -> tuple[DynamicCache, torch.Tensor]:
    """B kept rows -> a cache whose layers hold keys and values (B, H, C, D), each row left-padded to C, the
    longest, with zeros, and its attention mask (B, C) int64 (1 on the kept tokens)."""
    width = max(k.length for k in kept)
    attention = torch.zeros((len(kept), width), dtype=torch.long, device=device)
    for row, k in enumerate(kept):
        attention[row, width - k.length:] = 1

    def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
        heads, _, dim = tensors[0].shape
        out = tensors[0].new_zeros((len(tensors), heads, width, dim), device=device)
        for row, t in enumerate(tensors):
            out[row, :, width - t.shape[1]:] = t
        return out

    layers = [(stacked([k.keys[i] for k in kept]), stacked([k.values[i] for k in kept]))
              for i in range(len(kept[0].keys))]
    return DynamicCache(ddp_cache_data=layers), attention
