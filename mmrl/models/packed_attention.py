"""Attention over prompt-shared rows that computes only the (query, key) pairs the layout allows.

A packed batch (:mod:`mmrl.models.packing`) is one flat sequence of N tokens: each distinct prompt once, then
its responses, each over its own extent, with no padding between them. Every layer but attention works on the
N tokens as they are. Attention sees a prompt token attend to its prompt, and a response token to its prompt
and its own response; one mask over the flat sequence (N x N) would compute every other pair too, and a padded
(group, width) layout pays the padding in every layer. Here attention gathers, per layer:

- the prompts' queries, keys and values into (G, P) rows (P: the longest prompt), causal;
- each response's queries (B, R) and its keys and values: its prompt's P then its own R, so (B, P + R);

runs SDPA on each with a (rows, 1, queries, keys) bool mask, and puts each query's output back at its flat
place. The pairs computed are G*P^2 + B*R*(P + R), not N^2 (the bench's 64 prompts of 32 tokens with 8 responses
of up to 32 each: 1.1 M a layer, where one padded 264-token row per prompt took 4.5 M).

Responses of very different lengths are attended in **buckets** (:func:`length_buckets`): sorted by extent and cut
where an extent falls under two thirds of its bucket's longest, each bucket at its own width. Padding a 30-token
response to the 256 of the longest would otherwise cost it 256 x (P + 256) pairs: on the long-tail bench's lengths
(p10 34, p50 230 of at most 256 tokens) the flash kernel's forward and backward were a quarter of the update.

The layout reaches the attention of every language-model layer as the ``packed_layout`` keyword of the model's
forward (transformers passes a forward's extra keywords down to its attention function, also through activation
checkpointing's recomputation). :func:`install` wraps transformers' attention lookup so that a call carrying a
layout runs :func:`packed_attention` whatever the attention implementation; a call without one runs the model's
own. Each call counts itself on the layout, so the forward can check that the model did take it
(:meth:`PackedLayout.check_used`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F

ORIGINAL: dict[str, Any] = {}


@dataclass
class PackedLayout:
    """Where each token of the flat packed sequence (N tokens) sits in the gathered attention rows.

    prompt_index (G, P), response_index (B, R): each row's flat token indices (0 where a row is shorter);
    response_group (B,): each response's prompt; prompt_keys (G, P), response_keys (B, R) bool: the tokens a
    query may attend to (a response token outside the attention extent is no key); buckets: the responses attended
    together, (rows (B_k,), width W_k) each (empty: one bucket of every response at width R); source (N,): for each
    flat token, its row in the gathered outputs, prompts' (G*P) first, then each bucket's (B_k*W_k) in order.
    """

    prompt_index: torch.Tensor
    prompt_keys: torch.Tensor
    response_index: torch.Tensor
    response_keys: torch.Tensor
    response_group: torch.Tensor
    source: torch.Tensor
    buckets: tuple[tuple[torch.Tensor, int], ...] = ()
    calls: int = field(default=0, compare=False)
    _gathered: tuple[torch.Tensor, list[Bucket]] | None = field(default=None, compare=False, repr=False)

    def to(self, device: torch.device | str) -> PackedLayout:
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)
                 if f.name not in ("calls", "_gathered", "buckets")}
        return PackedLayout(**moved, buckets=tuple((rows.to(device), width) for rows, width in self.buckets))

    def response_buckets(self) -> tuple[tuple[torch.Tensor, int], ...]:
        return self.buckets or ((torch.arange(len(self.response_index), device=self.source.device),
                                 self.response_index.shape[1]),)

    def masks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Bool masks, True where a query attends: prompts (G, 1, P, P), causal over their own valid tokens;
        responses (B, 1, R, P + R) (see :meth:`response_mask`)."""
        every = torch.arange(len(self.response_index), device=self.source.device)
        return self.prompt_mask(), self.response_mask(every, self.response_index.shape[1])

    def prompt_mask(self) -> torch.Tensor:
        """(G, 1, P, P) bool: each prompt token sees its prompt's valid tokens up to itself, and itself."""
        return _causal(self.prompt_index.shape[1], self.source.device, self.prompt_keys)[:, None]

    def response_mask(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """rows (M,) of the responses, attended at ``width`` -> (M, 1, width, P + width) bool: each query sees its
        prompt's valid tokens and the valid ones of its own response up to itself. Every query also sees itself,
        so that no softmax row is empty (a padding query's output is dropped; an empty row would be NaN, and NaN
        would reach the gradients)."""
        own = _causal(width, self.source.device, self.response_keys[rows, :width])
        context = self.prompt_keys[self.response_group[rows]][:, None, :].expand(-1, width, -1)
        return torch.cat([context, own], dim=2)[:, None]

    def gathered(self) -> tuple[torch.Tensor, list[Bucket]]:
        """The prompts' mask and each bucket's query indices, key indices and mask (:class:`Bucket`), built once
        for every layer of a forward."""
        if self._gathered is None:
            buckets = []
            for rows, width in self.response_buckets():
                queries = self.response_index[rows, :width]
                keys = torch.cat([self.prompt_index[self.response_group[rows]], queries], dim=1)
                buckets.append(Bucket(queries, keys, self.response_mask(rows, width)))
            self._gathered = (self.prompt_mask(), buckets)
        return self._gathered

    def check_used(self) -> None:
        if self.calls == 0:
            raise RuntimeError("the model's attention never received the packed layout: its attention does not go "
                               "through transformers' ALL_ATTENTION_FUNCTIONS; score it unpacked "
                               "(share_prompt=False)")


@dataclass(frozen=True)
class Bucket:
    """Responses attended together: queries (M, W) and keys (M, P + W) flat indices, mask (M, 1, W, P + W)."""

    queries: torch.Tensor
    keys: torch.Tensor
    mask: torch.Tensor


def length_buckets(extents: torch.Tensor, ratio: float = 2 / 3) -> tuple[tuple[torch.Tensor, int], ...]:
    """extents (B,) -> buckets of responses, (rows (B_k,), width W_k) each: sorted longest first, a new bucket
    begins where an extent falls under ``ratio`` x its bucket's longest, which is the bucket's width (at least 1).
    One bucket when the extents are close (every response of a random-init model runs to the cap)."""
    order = torch.argsort(extents, descending=True, stable=True)
    sorted_extents = extents[order].tolist()
    buckets, start = [], 0
    for i, extent in enumerate(sorted_extents):
        if extent < ratio * sorted_extents[start]:
            buckets.append((order[start:i], max(sorted_extents[start], 1)))
            start = i
    buckets.append((order[start:], max(sorted_extents[start], 1)))
    return tuple(buckets)


def _causal(width: int, device: torch.device, keys: torch.Tensor) -> torch.Tensor:
    """keys (M, W) bool -> (M, W, W): query i sees key j <= i where the key is valid, and itself."""
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    return (causal & keys[:, None, :]) | torch.eye(width, dtype=torch.bool, device=device)


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: PackedLayout,
    dropout: float = 0.0,
    scaling: float | None = None,
) -> torch.Tensor:
    """query (1, h, N, d), key and value (1, kv, N, d) of the flat packed sequence (rotary already applied) ->
    (1, N, h, d), as transformers' attention functions return it."""
    if query.shape[0] != 1:
        raise ValueError(f"a packed sequence is one flat row; got a batch of {query.shape[0]}")
    layout.calls += 1
    prompt_mask, buckets = layout.gathered()
    q, k, v = (_rows(t) for t in (query, key, value))
    parts = [_attend(q, k, v, layout.prompt_index, layout.prompt_index, prompt_mask, dropout, scaling)]
    parts += [_attend(q, k, v, b.queries, b.keys, b.mask, dropout, scaling) for b in buckets]
    rows = torch.cat([part.flatten(0, 1) for part in parts])  # (G*P + sum of B_k*W_k, h, d)
    return rows.index_select(0, layout.source)[None]


def _rows(states: torch.Tensor) -> torch.Tensor:
    """states (1, heads, N, d) -> (N, heads, d), contiguous: gathering whole rows is twice as fast as gathering
    along N inside each head."""
    return states[0].transpose(0, 1).contiguous()


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor,
            mask: torch.Tensor, dropout: float, scaling: float | None) -> torch.Tensor:
    """Gathered attention of query (N, h, d), key and value (N, kv, d) rows: queries (M, Q), keys (M, K) flat
    indices; mask (M, 1, Q, K) -> (M, Q, h, d)."""
    q = _gather(query, queries)
    k, v = _gather(key, keys), _gather(value, keys)
    gqa = q.shape[1] != k.shape[1]
    if gqa and q.device.type != "cpu":  # CUDA's fused kernels take no mask with enable_gqa
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        gqa = False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2)


def _gather(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """rows (N, heads, d), index (M, L) -> (M, heads, L, d)."""
    return rows.index_select(0, index.reshape(-1)).unflatten(0, index.shape).transpose(1, 2)


def dispatch(original: Callable[..., Any], module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor, attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> Any:
    """An attention call: :func:`packed_attention` when it carries a ``packed_layout`` and is the language model's
    (causal, over the N packed tokens), else the model's own (a vision tower handed the forward's keywords too)."""
    layout = kwargs.pop("packed_layout", None)
    text = getattr(module, "is_causal", False) and query.shape[2] == layout.source.numel() if layout else False
    if not text:
        return original(module, query, key, value, attention_mask, *args, **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("packed attention with a sliding window: score unpacked (share_prompt=False)")
    dropout = kwargs.get("dropout", args[0] if args else 0.0)
    return packed_attention(module, query, key, value, layout, dropout, kwargs.get("scaling")), None


def get_interface(attn_implementation: str, default: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' ``ALL_ATTENTION_FUNCTIONS.get_interface``, its answer wrapped in :func:`dispatch`."""
    return functools.partial(dispatch, ORIGINAL["get_interface"](attn_implementation, default))


def install() -> None:
    """Route every attention call of transformers' models through :func:`dispatch` (idempotent)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if "get_interface" not in ORIGINAL:
        ORIGINAL["get_interface"] = ALL_ATTENTION_FUNCTIONS.get_interface
        ALL_ATTENTION_FUNCTIONS.get_interface = get_interface
