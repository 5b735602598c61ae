"""Activation checkpointing of a VLM's blocks, per part (``<section>.vision|llm.activation_checkpointing``).

A checkpointed block keeps only its input from the forward pass; its backward first runs the block's forward
again to rebuild the intermediates. Memory per block falls from its intermediates to its input, for about one
more forward's compute.

**The mechanism: transformers' own, set per block.** Every vision block and decoder layer of the supported
families is a ``transformers.modeling_layers.GradientCheckpointingLayer``: when the block's
``gradient_checkpointing`` flag is set and the block is in training mode, its ``__call__`` runs
``nn.Module.__call__`` (the forward with its hooks) through the block's ``_gradient_checkpointing_func``.
Here that function is :func:`checkpointed` (torch's non-reentrant checkpoint), set on the blocks of one part
only (``model.gradient_checkpointing_enable()`` would switch every part at once). Chosen over torch's
``checkpoint_wrapper`` because:

- no module is replaced: parameter names stay the Hugging Face names that the rollout engines, the
  checkpoints (DCP keys) and the weight export read (a wrapper inserts ``_checkpoint_wrapped_module.`` into
  every name below it);
- with FSDP2, the block's own hooks run inside the checkpointed call. When the backward recomputes the
  block, FSDP2's pre-forward hook finds it in PRE_BACKWARD (its pre-backward hook has gathered the
  parameters already) and only makes sure they are unsharded: the composition FSDP2 supports as
  "module-hook-based activation checkpointing";
- it runs only on a module in training mode: the rollout engine's ``generate`` (eval mode) and the frozen
  reference never reach it.

**Non-reentrant**, because the reentrant variant returns no gradients to a block's parameters unless a
*positional* input requires grad, and loses those of keyword inputs (the layers take their position
embeddings and masks by keyword). The non-reentrant one records through saved-tensor hooks: a frozen
vision tower (no parameter and no input requiring grad) records nothing, so it is neither kept nor
recomputed, and trains nothing, as without checkpointing.

**No-grad passes** (log-probs, values, a model left in training mode) call the block directly:
nothing is recorded there, so there is nothing to recompute, and the checkpoint's RNG bookkeeping is skipped.

**Order with FSDP2**: :func:`mmrl.parallel.sharding.shard_parts` applies it before ``fully_shard``
(checkpoint, then shard: the order FSDP2 and torchtitan document). Setting a flag changes no module, so
either order would build the same model; the fixed order keeps it right if the mechanism changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer


def checkpointed(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, checkpointed (non-reentrant) when autograd records; plainly under no_grad."""
    if not torch.is_grad_enabled():
        return function(*args)
    return checkpoint(function, *args, use_reentrant=False)


def apply_activation_checkpointing(blocks: Iterable[nn.Module], part: str) -> int:
    """Turn checkpointing on for each of ``blocks`` (one part's vision blocks or decoder layers); returns the
    number of blocks. ``part`` ("vision" or "llm") names the part in the error for a block that is not a
    ``GradientCheckpointingLayer``."""
    count = 0
    for block in blocks:
        if not isinstance(block, GradientCheckpointingLayer):
            raise TypeError(f"{part}.activation_checkpointing=true, but the {part} blocks are "
                            f"{type(block).__name__}, not transformers GradientCheckpointingLayers; set "
                            f"{part}.activation_checkpointing=false for this model")
        block.gradient_checkpointing = True
        block._gradient_checkpointing_func = checkpointed
        count += 1
    return count
