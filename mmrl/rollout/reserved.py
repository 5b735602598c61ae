"""KV cache layers with room reserved for the tokens still to decode: a decode step writes its keys and values
in place instead of concatenating the whole cache into a new tensor.

transformers' ``DynamicLayer`` grows by ``torch.cat``: every decoded token copies every layer's whole cache, so a
response of T tokens copies O(T^2) keys and values (73 ms of a 64 x 8 x 32 rollout's 340 ms on the bench model,
2 cores). A :class:`ReservedLayer` holds its keys and values as views of buffers with room for ``reserve`` more
tokens: an update writes its tokens after the held ones and widens the view. SDPA reads the strided view as it
reads a contiguous tensor (the same result, the same time). Whatever else replaces the held tensors (reordering or
narrowing the batch, repeating it, a kept context joined) is a new tensor, and the next update moves it into a
new buffer: one copy, as a concatenation would make.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


class ReservedLayer(DynamicLayer):
    """A full-attention cache layer (B, H, W, D) whose keys and values are views of (B, H, W + room, D) buffers."""

    def __init__(self, reserve: int) -> None:
        super().__init__()
        self.reserve = reserve
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    @classmethod
    def of(cls, layer: DynamicLayer, reserve: int) -> ReservedLayer:
        """``layer``'s keys and values (not copied), with ``reserve`` tokens of room made at the next update."""
        out = cls(reserve)
        out.__dict__.update({k: v for k, v in layer.__dict__.items() if k not in ("key_buffer", "value_buffer")})
        out.reserve = reserve
        return out

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states, value_states (B, H, q, D) -> the held keys and values with them, (B, H, W + q, D)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.key_buffer = self._append(self.keys, self.key_buffer, key_states)
        self.values, self.value_buffer = self._append(self.values, self.value_buffer, value_states)
        return self.keys, self.values

    def _append(self, held: torch.Tensor, buffer: torch.Tensor | None, new: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        width = held.shape[-2] if held.numel() else 0
        end = width + new.shape[-2]
        if not (buffer is not None and width and _is_head_of(held, buffer) and end <= buffer.shape[-2]):
            buffer = new.new_empty((*new.shape[:-2], end + self.reserve, new.shape[-1]))
            if width:
                buffer[:, :, :width].copy_(held)
        buffer[:, :, width:end].copy_(new)
        return buffer[:, :, :end], buffer


def _is_head_of(held: torch.Tensor, buffer: torch.Tensor) -> bool:
    """Whether ``held`` is ``buffer[:, :, :W]`` (the layer's own view, perhaps cropped), not a new tensor."""
    return (held.data_ptr() == buffer.data_ptr() and held.shape[:2] == buffer.shape[:2]
            and held.shape[-1] == buffer.shape[-1] and held.stride() == buffer.stride())


def reserve(cache: Any, tokens: int) -> None:
    """Give each plain full-attention layer of ``cache`` (a transformers ``Cache``) room for ``tokens`` more
    tokens, in place; other kinds of layer (sliding windows, recurrent states) are left as they are."""
    layers = getattr(cache, "layers", None) or []
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            layers[i] = ReservedLayer.of(layer, tokens)
        elif type(layer) is ReservedLayer:
            layer.reserve = tokens
