"""The model's sections: which checkpoint and family (``model``), the tiny model built locally (``tiny_model``),
how each part of a model is laid out over the ranks (``<group>.vision``, ``<group>.llm``) and LoRA (``actor.lora``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mmrl.config_fields import num


@dataclass(kw_only=True)
class ModelConfig:
    path: str = "outputs/model/tiny-qwen2.5-vl"
    """Local directory of a Hugging Face VLM checkpoint (the tiny model, or e.g. Qwen2.5-VL-3B-Instruct)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for training and rollout."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    """Attention kernel passed to transformers."""
    compile: bool = True
    """Run each block's RMSNorms and SiLU gate as torch.compile kernels (mmrl/models/fused.py): about a tenth off
    an update's time on the bench model (docs/performance.md). Off, or where compilation fails: eager."""
    family: Literal["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "smolvlm"] = "qwen2_5_vl"
    """The model family ``make model`` builds a tiny model of (mmrl/models/families/). Every other stage reads a
    checkpoint's family from its config.json (``model_type``), never from here."""


@dataclass(frozen=True, kw_only=True)
class TinyModelConfig:
    """Sizes of the tiny model that ``make model`` builds (of the family ``model.family``)."""

    vocab_size: int = num(384, ge=64)
    hidden_size: int = num(128, ge=8)
    num_layers: int = num(3, ge=1)
    num_heads: int = num(4, ge=1)
    num_kv_heads: int = num(2, ge=1)
    intermediate_size: int = num(512, ge=1)
    vision_depth: int = num(2, ge=1)
    vision_hidden_size: int = num(64, ge=8)
    vision_heads: int = num(4, ge=1)
    patch_size: int = num(0, ge=0)
    """Vision patch side in pixels; 0: the family's own."""
    merge_size: int = num(2, ge=1)
    min_pixels: int = num(28 * 28, ge=1)
    max_pixels: int = num(112 * 112, ge=1)


Strategy = Literal["replicate", "fsdp", "hsdp"]


@dataclass(kw_only=True)
class PartConfig:
    """How one part of a model (the vision encoder or the LLM) is laid out over a worker group."""

    strategy: Strategy = "replicate"
    """replicate: full copy per rank, gradients all-reduced; fsdp: FSDP2 over all ranks; hsdp: FSDP2 within
    groups of ``shard_size`` ranks, replicated across the groups."""
    shard_size: int = num(0, ge=0)
    """hsdp only: ranks per shard group (must divide resources.num_workers)."""
    activation_checkpointing: bool = False
    """Recompute each block's activations (vision blocks / decoder layers) in the backward pass instead of
    keeping them from the forward: activation memory per block falls from its intermediates to its input,
    for about one more forward's compute. Only gradient passes of a model in training mode recompute (the
    rollout and the no-grad log-prob passes run plainly); gradients equal the plain path's."""


@dataclass(kw_only=True)
class VisionPartConfig(PartConfig):
    freeze: bool = False
    """Keep the vision encoder's weights fixed (no gradients, no optimizer state)."""


LLM_LINEAR_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(kw_only=True)
class LoRAConfig:
    """Low-rank adapters (peft LoRA) on the actor: the base weights stay frozen, only the adapters train; the KL
    reference is the base with the adapters switched off, and the rollout engine gets merged weights."""

    rank: int = num(0, ge=0)
    """Rank of each adapter; 0: no LoRA (full fine-tuning)."""
    alpha: float = num(32.0, gt=0)
    """The adapters' output is scaled by ``alpha / rank``."""
    dropout: float = num(0.0, ge=0, le=0.9)
    """Dropout on the adapters' input while training (0: the update's forward equals the log-prob passes')."""
    target_modules: list[str] = field(default_factory=lambda: list(LLM_LINEAR_LAYERS))
    """Names of the language model's linear layers that get adapters (a layer's own name, e.g. ``q_proj``, or a
    dotted tail, e.g. ``self_attn.q_proj``), matched inside the language model only, never the vision tower."""
    include_vision: bool = False
    """Also put adapters on every linear layer of the vision tower (its blocks and merger); false: the vision
    tower stays frozen (as EasyR1 and prime-rl do)."""


