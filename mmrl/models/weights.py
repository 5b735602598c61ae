"""Weight names between the trainer's modules and the Hugging Face model: the one place they are adapted.

The trainer wraps the Hugging Face ``*ForConditionalGeneration`` model in
:class:`~mmrl.models.forward.PolicyForward` under the attribute ``model``, so the trainer's parameter names
carry a ``model.`` prefix. Rollout engines (``update_weights``) and checkpoints take the Hugging Face
model's own parameter names; an engine that needs other names maps them from these.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

POLICY_PREFIX = "model."


def to_hf_names(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(PolicyForward name, tensor) -> (Hugging Face model name, the same tensor), lazily."""
    for name, tensor in named_tensors:
        if not name.startswith(POLICY_PREFIX):
            raise ValueError(f"{name!r} is not a PolicyForward parameter name (no {POLICY_PREFIX!r} prefix)")
        yield name[len(POLICY_PREFIX):], tensor
