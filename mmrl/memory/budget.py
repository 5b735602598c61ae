"""Micro-batch token budgets sized from the model and the memory at hand (the default of every pass).

A pass (the update, a no-grad scoring pass, the hf engine's generation) runs its rows in micro-batches. A user
may give a row count (``micro_batch_size``) or a token budget (``max_tokens_per_micro``); when both are 0 (or
``auto``) the budget is sized here, once, where the worker is built:

    tokens = (memory - fixed) // bytes_per_token

- ``memory`` (:func:`memory_at_hand`): on CUDA the free memory after the models are loaded, times
  ``CUDA_FRACTION``, divided among the worker groups colocated on the GPU; on CPU ``MemAvailable`` of
  /proc/meminfo, times ``CPU_FRACTION``, divided among every rank of every group (on one host they share it),
  at most ``CPU_CAP_BYTES`` per rank. The caller then subtracts what its optimizer will still allocate
  (:func:`training_state_bytes`: gradients and AdamW's two moments).
- ``bytes_per_token`` (:func:`bytes_per_token`), from the decoder's widths (:class:`ModelDims`):
  the update keeps each layer's activations for backward (``LAYER_HIDDEN`` x hidden + ``LAYER_INTERMEDIATE``
  x intermediate elements per token and layer, in the model's dtype, plus the float32 copies of its two
  RMSNorms), or with activation checkpointing only each layer's input plus one layer recomputed; a no-grad
  pass holds one layer's working set; the rollout holds the KV cache of every sample's prompt and response.
- ``fixed``: the LM head's logits of one chunk of tokens (the log-probs are computed in chunks of tokens, so
  the (tokens, V) logits are not a per-token cost): ``LOGIT_COPIES`` float32 (chunk, V) buffers.

The coefficients were measured on this repository's Qwen2.5-VL forward (autograd's saved tensors per token:
9-13 x hidden + 4 x intermediate per layer, the packed rows of ``share_prompt`` the highest), and each pass
adds one layer's worth for its transient buffers. Image tokens are counted as text tokens: a trained vision
tower's own activations per image token are not in the estimate (``*.vision.activation_checkpointing`` or an
explicit budget covers image-heavy prompts).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from mmrl.config import Config, RewardModelConfig, UpdateConfig

Kind = Literal["update", "score", "rollout"]

FLOAT32 = 4
LAYER_HIDDEN = 13
"""Hidden-width activations a decoder layer keeps per token for backward: the norms' inputs and outputs, q,
the attention output, the output projection, the residual sums, rotary copies (measured 9-13)."""
LAYER_INTERMEDIATE = 4
"""Intermediate-width ones: gate, up, act(gate), act(gate) x up."""
OUTSIDE_HIDDEN = 4
"""Hidden-width tensors per token outside the layers in a gradient pass: the embeddings, the final norm's input
and output, the gradient flowing back."""
SCORE_HIDDEN, SCORE_INTERMEDIATE = 6, 3
"""A no-grad pass's working set per token: the residual stream, the normed input, q/k/v and the attention
output; or the MLP's up, act(gate) and their product."""
LOGIT_COPIES = 3
"""Float32 (chunk, V) buffers alive while one chunk of tokens is scored: logits, probabilities, gradient."""
DECODE_LOGIT_COPIES = 4
"""Float32 (samples, V) buffers of one decode step: logits, log-softmax, probabilities, the truncated copy."""
AUTO_CHUNK_BYTES = 128 * 2**20
"""The chunked log-probs' automatic chunk: as many tokens as keep one chunk's float32 logits within 128 MiB."""
CUDA_FRACTION = 0.85
"""Of a GPU's free memory (the rest: the allocator's fragmentation, cuBLAS workspaces, FSDP's all-gathers)."""
CPU_FRACTION = 0.5
"""Of MemAvailable on CPU (the host is shared with the driver, Ray and the reward workers)."""
CPU_CAP_BYTES = 8 * 2**30
"""At most this much per CPU rank, however much the host has."""


@dataclass(frozen=True)
class ModelDims:
    """The widths that set a decoder's activation memory per token."""

    hidden: int
    layers: int
    intermediate: int
    kv_dim: int
    """Key (and value) width per token and layer: key/value heads x head dim."""
    vocab: int
    """The LM head's width; 0 for a model without one (a value model's scalar head)."""
    dtype_bytes: int
    """Bytes per activation element (the model's parameter dtype)."""

    @classmethod
    def of(cls, model: nn.Module, lm_head: bool = True) -> ModelDims:
        """The dims of a Hugging Face (V)LM, read from its text config (``model.config.text_config`` or
        ``model.config``) and its parameters' dtype; ``lm_head=False`` for a value model."""
        config = model.config
        text = getattr(config, "text_config", None) or config
        heads = int(text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        return cls(hidden=int(text.hidden_size), layers=int(text.num_hidden_layers),
                   intermediate=int(text.intermediate_size), kv_dim=kv_heads * head_dim,
                   vocab=int(text.vocab_size) if lm_head else 0, dtype_bytes=torch.finfo(dtype).bits // 8)


def layer_bytes(dims: ModelDims) -> int:
    """Bytes one decoder layer keeps per token for its backward (its two RMSNorms compute in float32: with a
    narrower dtype each keeps a float32 copy of its input beside its output)."""
    widths = LAYER_HIDDEN * dims.hidden + LAYER_INTERMEDIATE * dims.intermediate
    return dims.dtype_bytes * widths + 2 * dims.hidden * max(0, FLOAT32 - dims.dtype_bytes)


def score_bytes(dims: ModelDims) -> int:
    """Bytes per token of a no-grad forward: one layer's working set (the others are freed as it goes)."""
    widths = max(SCORE_HIDDEN * dims.hidden, 2 * dims.hidden + SCORE_INTERMEDIATE * dims.intermediate)
    return dims.dtype_bytes * widths + 2 * dims.hidden * max(0, FLOAT32 - dims.dtype_bytes)


def bytes_per_token(dims: ModelDims, kind: Kind, *, checkpointing: bool = False, samples_per_prompt: int = 1,
                    tokens_per_sample: int = 1) -> float:
    """Memory one more token of a micro-batch costs in a pass of ``kind``.

    update: every layer's saved activations plus one layer's transient (with ``checkpointing``: each layer's
    input, plus one layer recomputed and its backward), plus ``OUTSIDE_HIDDEN`` hidden-width tensors.
    score: one layer's working set. rollout (a token is one of a sample's prompt or response tokens): its key and
    value in every layer (plus one layer's copy while the cache grows), its prompt's prefill working set shared
    by the ``samples_per_prompt`` samples, and the decode step's (samples, V) logits shared by the sample's
    ``tokens_per_sample`` tokens (at least ``max_new_tokens``).
    """
    if kind == "update":
        layers = dims.layers * dims.dtype_bytes * dims.hidden + 2 * layer_bytes(dims) if checkpointing else \
            (dims.layers + 1) * layer_bytes(dims)
        return layers + OUTSIDE_HIDDEN * dims.hidden * dims.dtype_bytes
    if kind == "score":
        return score_bytes(dims) + dims.hidden * dims.dtype_bytes  # + the final hidden states, kept for the head
    if kind == "rollout":
        cache = 2 * dims.kv_dim * dims.dtype_bytes * (dims.layers + 1)
        decode_logits = DECODE_LOGIT_COPIES * dims.vocab * FLOAT32
        return cache + score_bytes(dims) / samples_per_prompt + decode_logits / tokens_per_sample
    raise ValueError(f"unknown pass kind {kind!r}; allowed: update, score, rollout")


def fixed_bytes(dims: ModelDims, kind: Kind, logit_chunk_tokens: int = 0) -> int:
    """What a pass holds whatever its micro-batch's size: the float32 logits of one chunk of scored tokens
    (``logit_chunk_tokens``; 0: the automatic chunk of ``AUTO_CHUNK_BYTES``), in the passes that score
    tokens with an LM head (the rollout's decode logits are counted per sample)."""
    if kind == "rollout" or not dims.vocab:
        return 0
    chunk = logit_chunk_tokens or max(1, AUTO_CHUNK_BYTES // (FLOAT32 * dims.vocab))
    return LOGIT_COPIES * chunk * dims.vocab * FLOAT32


def token_budget(dims: ModelDims, memory_bytes: int, kind: Kind = "update", *, checkpointing: bool = False,
                 logit_chunk_tokens: int = 0, samples_per_prompt: int = 1, tokens_per_sample: int = 1) -> int:
    """Tokens per micro-batch that fit in ``memory_bytes`` (what the pass may use beyond the weights and the
    optimizer): ``(memory - fixed) // bytes_per_token``, at least 1 (then every row is a micro-batch of its own).
    See :func:`bytes_per_token` and :func:`fixed_bytes` for the arguments."""
    per_token = bytes_per_token(dims, kind, checkpointing=checkpointing, samples_per_prompt=samples_per_prompt,
                                tokens_per_sample=tokens_per_sample)
    usable = memory_bytes - fixed_bytes(dims, kind, logit_chunk_tokens)
    return max(1, int(usable // per_token))


# ---------------------------------------------------------------------------------------------------
# The memory at hand


def mem_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The host's MemAvailable; where /proc is missing, the physical memory from sysconf."""
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_at_hand(device: torch.device, processes: int = 1) -> int:
    """Bytes this rank's passes may use now: on CUDA the device's free memory (plus what torch's allocator holds
    unused) times ``CUDA_FRACTION``; on CPU MemAvailable times ``CPU_FRACTION``, at most ``CPU_CAP_BYTES``;
    either divided by ``processes``, the worker processes that share this memory (:func:`sharers`)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free * CUDA_FRACTION / processes)
    return int(min(mem_available_bytes() * CPU_FRACTION / processes, CPU_CAP_BYTES))


def sharers(cfg: Config, device_type: str, needs_critic: bool) -> int:
    """Worker processes sharing a rank's memory: on a GPU, the actor's rank and the ranks of the groups colocated
    on its GPU (the critic when ``needs_critic``, the reward model and the judge when configured); on CPU, every
    rank of every group (on one host they share its RAM)."""
    groups = [(needs_critic, cfg.critic.placement), (bool(cfg.reward.model.path), cfg.reward.model.placement),
              (bool(cfg.reward.judge.path), cfg.reward.judge.placement)]
    used = [placement == "colocate" for wanted, placement in groups if wanted]
    if device_type == "cuda":
        return 1 + sum(used)
    return cfg.resources.num_workers * (1 + len(used))


def training_state_bytes(params: Iterable[nn.Parameter]) -> int:
    """Bytes the optimizer has yet to allocate for ``params`` on this rank (the local shard of a sharded one):
    a gradient and AdamW's two moments each, in the parameter's dtype."""
    from torch.distributed.tensor import DTensor

    total = 0
    for p in params:
        local = p.to_local() if isinstance(p, DTensor) else p
        total += 3 * local.numel() * local.element_size()
    return total


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s parameters on this rank."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


# ---------------------------------------------------------------------------------------------------
# Explicit settings win


@dataclass(frozen=True)
class MicroBatching:
    """How a pass cuts its rows: by a token budget (``tokens`` > 0), else at most ``rows`` rows."""

    rows: int = 0
    tokens: int = 0
    auto: bool = False
    """The token budget was sized here (nothing was set)."""

    def __str__(self) -> str:
        if self.tokens:
            return f"{self.tokens} tokens" + (" (auto)" if self.auto else "")
        return f"{self.rows} rows"


def choose(rows: int, tokens: int, auto: Callable[[], int]) -> MicroBatching:
    """The user's token budget when set (> 0), else the user's row count when set, else ``auto()`` tokens (as
    ``max_tokens_per_micro`` always took precedence over ``micro_batch_size``)."""
    if tokens < 0 or rows < 0:
        raise ValueError(f"micro-batch settings must be >= 0 (0: automatic), got rows={rows}, tokens={tokens}")
    if tokens:
        return MicroBatching(tokens=tokens)
    if rows:
        return MicroBatching(rows=rows)
    return MicroBatching(tokens=auto(), auto=True)


def budget_ranges(costs: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive ranges [start, stop) of items whose ``costs`` add up to at most ``budget``; an item over the
    budget stands alone."""
    ranges, start, total = [], 0, 0
    for index, cost in enumerate(costs):
        if index > start and total + cost > budget:
            ranges.append((start, index))
            start, total = index, 0
        total += cost
    if costs:
        ranges.append((start, len(costs)))
    return ranges


def update_batching(section: UpdateConfig, dims: ModelDims, memory_bytes: int) -> MicroBatching:
    """The update's micro-batches for an actor or critic ``section``: its settings, else a token budget for a
    gradient pass in ``memory_bytes``, with the LLM's activation checkpointing when it is on."""
    checkpointing = bool(getattr(section.llm, "activation_checkpointing", False))
    chunk = int(getattr(section, "logprob_chunk_tokens", 0))
    return choose(section.micro_batch_size, section.max_tokens_per_micro, lambda: token_budget(
        dims, memory_bytes, "update", checkpointing=checkpointing, logit_chunk_tokens=chunk))


def score_batching(section: UpdateConfig | RewardModelConfig, dims: ModelDims, memory_bytes: int) -> MicroBatching:
    """A no-grad pass's micro-batches (log-probs, values, reward-model scores) for a config ``section`` (actor,
    critic, reward.model): its settings, else a token budget for a no-grad pass in ``memory_bytes``."""
    chunk = int(getattr(section, "logprob_chunk_tokens", 0))
    return choose(section.micro_batch_size, section.max_tokens_per_micro, lambda: token_budget(
        dims, memory_bytes, "score", logit_chunk_tokens=chunk))
