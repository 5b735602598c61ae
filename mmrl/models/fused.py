"""The element-wise parts of a block as fused kernels (``model.compile``): RMSNorm and the SiLU-gated MLP's gate.

In eager torch, an RMSNorm is six passes over its (tokens, hidden) input forward (cast, square, mean, rsqrt, two
products) and as many backward, and the gated MLP's ``silu(gate) * up`` is two passes over (tokens, FFN) forward
and three backward. On the bench model's 64 x 8 x 32 update they took about a quarter of the update's time, every
pass a full read and write of its tensor. :func:`fuse` gives each such module of a loaded model a forward whose
element-wise part is one ``torch.compile`` kernel (dynamic shapes, so one compilation serves every length) on
tensors of at least :data:`MIN_ELEMENTS` elements, and the same math eager on smaller ones; the
matrix products stay the model's own ``nn.Linear`` calls, so LoRA, FSDP and the weights are untouched. Only the
modules whose forward is known to be that math are changed (:data:`RMS_NORMS`, :data:`GATED_MLPS`); the result
equals the eager forward and backward to float rounding (tests/unit/test_fused.py).

Compilation needs a working ``torch.compile`` backend (a C++ compiler on CPU, Triton on GPU). :func:`fuse` runs
both kernels once on a small input first; if that fails, the model stays eager and a warning says why.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

RMS_NORMS = ("Qwen2RMSNorm", "Qwen2VLRMSNorm", "Qwen2_5_VLRMSNorm", "Qwen3VLTextRMSNorm", "LlamaRMSNorm")
"""Classes whose forward is ``weight * (x / sqrt(mean(x^2) + eps))`` in float32, cast back (T5's layer norm)."""
GATED_MLPS = ("Qwen2MLP", "Qwen2_5_VLMLP", "Qwen3VLTextMLP", "LlamaMLP")
"""Classes whose forward is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``; fused only where act_fn is SiLU."""
SILU = ("SiLU", "SiLUActivation")
"""torch's and transformers' SiLU modules (both ``F.silu``)."""
MIN_ELEMENTS = 1 << 18
"""Smaller tensors (a decode step's (rows, 1, hidden)) run the same math eager: a compiled call's own cost (its
guards, about 70 us on CPU) exceeds what fusing saves below about this size (on CPU, 2 threads: a (512, 1, 128)
RMSNorm 72 us eager, 94 us compiled; (128, 40, 128) 678 us eager, 350 us compiled)."""
KERNELS: dict[str, Any] = {}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (..., H), weight (H,) -> (..., H): RMSNorm in float32, cast back to x's dtype, times the weight."""
    dtype = x.dtype
    x = x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


def silu_gate(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up (..., F) -> silu(gate) * up (..., F)."""
    return F.silu(gate) * up


def kernels() -> dict[str, Any]:
    """The compiled kernels, one per process."""
    if not KERNELS:
        KERNELS.update(rms_norm=torch.compile(rms_norm, dynamic=True), silu_gate=torch.compile(silu_gate, dynamic=True))
    return KERNELS


def _norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    norm = KERNELS["rms_norm"] if hidden_states.numel() >= MIN_ELEMENTS else rms_norm
    return norm(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    gate, up = self.gate_proj(x), self.up_proj(x)
    return self.down_proj((KERNELS["silu_gate"] if gate.numel() >= MIN_ELEMENTS else silu_gate)(gate, up))


def fusable(module: nn.Module) -> str | None:
    """"norm", "mlp" or None: which fused forward ``module`` takes."""
    name = type(module).__name__
    if name in RMS_NORMS and hasattr(module, "variance_epsilon"):
        return "norm"
    if name in GATED_MLPS and type(getattr(module, "act_fn", None)).__name__ in SILU:
        return "mlp"
    return None


def fuse(model: nn.Module) -> int:
    """Give every fusable module of ``model`` its fused forward (once per module); returns how many changed, 0
    when the backend cannot compile here (the model stays eager)."""
    targets = [(m, kind) for m in model.modules() if (kind := fusable(m)) and "forward" not in vars(m)]
    if not targets:
        return 0
    try:
        warm_up(next(model.parameters()))
    except Exception as error:  # noqa: BLE001 -- any backend failure leaves the model eager
        log.warning("model.compile: torch.compile failed here (%s: %s); the model runs eager",
                    type(error).__name__, error)
        return 0
    for module, kind in targets:
        module.forward = types.MethodType(_norm_forward if kind == "norm" else _mlp_forward, module)
    return len(targets)


def warm_up(like: torch.Tensor) -> None:
    """Compile both kernels (forward and backward) on a small input of ``like``'s device and dtype."""
    compiled = kernels()
    x = torch.ones(2, 3, 8, device=like.device, dtype=like.dtype, requires_grad=True)
    weight = torch.ones(8, device=like.device, dtype=like.dtype, requires_grad=True)
    (compiled["rms_norm"](x, weight, 1e-6).sum() + compiled["silu_gate"](x, x).sum()).backward()
