"""``build_model(cfg, role, checkpoint)``: the one load -> wrap -> freeze -> lay out sequence.

===========  ==================  ===================  =================================================
role         module              layout from          trainable parameters
===========  ==================  ===================  =================================================
actor        PolicyForward       actor.vision / llm   all, but the vision tower when actor.vision.freeze
lora_actor   PolicyForward with  actor.vision / llm   the adapters only (``actor.lora``; the vision tower's
             LoRA adapters                            with actor.lora.include_vision): the base is frozen,
                                                      and with its adapters off it is the KL reference
reference    PolicyForward       actor.vision / llm   none (eval mode): the frozen KL anchor
critic       ValueModel          critic.vision / llm  all (backbone + a new zero value head), but the
                                                      vision tower when critic.vision.freeze
reward_model ValueModel + the    reward.model.vision  none: a trained reward model (``make rm``) scoring
             checkpoint's head   / llm                whole responses
rm_trainee   ValueModel          (single process)     all: ``make rm`` trains the backbone and a new head
judge        PolicyForward       (replicated)         none: a generative judge's policy
===========  ==================  ===================  =================================================

A new role is one more entry of ``ROLES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import nn

from mmrl.config import ActorConfig, Config, PartConfig, UpdateConfig, VisionPartConfig
from mmrl.models.families import family_of
from mmrl.models.forward import PolicyForward, ValueModel
from mmrl.models.loading import load_model
from mmrl.models.lora import apply_lora
from mmrl.parallel.sharding import Layout, shard_parts

Role = Literal["actor", "reference", "critic", "reward_model", "rm_trainee", "judge", "lora_actor"]


@dataclass(frozen=True)
class RoleSpec:
    wrap: Callable[[nn.Module], nn.Module]
    """Hugging Face model -> the root module the workers run (and FSDP shards)."""
    section: str
    """The config section whose ``vision`` / ``llm`` layouts apply (a dotted path; empty: replicated)."""
    trainable: bool
    load_head: bool = False
    """Load the checkpoint's scalar head (``value_head.safetensors``)."""
    lora: bool = False
    """Inject the LoRA adapters of ``<section>.lora`` (:mod:`mmrl.models.lora`) and train only them."""


ROLES: dict[str, RoleSpec] = {
    "actor": RoleSpec(PolicyForward, "actor", trainable=True),
    "reference": RoleSpec(PolicyForward, "actor", trainable=False),
    "critic": RoleSpec(ValueModel.from_policy, "critic", trainable=True),
    "reward_model": RoleSpec(ValueModel.from_policy, "reward.model", trainable=False, load_head=True),
    "rm_trainee": RoleSpec(ValueModel.from_policy, "", trainable=True),
    "judge": RoleSpec(PolicyForward, "", trainable=False),
    "lora_actor": RoleSpec(PolicyForward, "actor", trainable=True, lora=True),
}


def build_model(
    cfg: Config, role: Role, checkpoint: str, *, device: torch.device, world_size: int = 1, distributed: bool = True,
    model: nn.Module | None = None,
) -> Layout:
    """Load ``checkpoint`` as ``role`` and lay it out over ``world_size`` ranks.

    Every rank of a group calls it with the same arguments (sharding runs collectives). With
    ``distributed=False`` (a single process without a process group: SFT, tests) both parts stay
    replicated whatever the config says. ``model``: the Hugging Face model already loaded from ``checkpoint``
    (the role wraps it, sharing its weights, instead of loading another copy).
    """
    if role not in ROLES:
        raise ValueError(f"unknown model role {role!r}; allowed: {', '.join(ROLES)}")
    spec = ROLES[role]
    section = _section(cfg, spec.section)
    if model is None:
        model = load_model(checkpoint, cfg.model.dtype, cfg.model.attn_implementation, device,
                           cfg.model.compile)
    if spec.lora:
        assert isinstance(section, ActorConfig) and section.lora.rank, f"the {role} role needs actor.lora.rank > 0"
        apply_lora(model, section.lora, cfg.seed)
    root = spec.wrap(model).to(device)
    if spec.load_head:
        root.load_head(checkpoint)
    if not spec.trainable:
        root.eval().requires_grad_(False)
    elif section is not None and section.vision.freeze and not spec.lora:
        family_of(root.core.config).vision(root.core).requires_grad_(False)
    vision, llm = (section.vision, section.llm) if section is not None else (VisionPartConfig(), PartConfig())
    if not distributed:  # one process: both parts replicated, but each keeps its activation checkpointing
        vision, llm = (replace(p, strategy="replicate") for p in (vision, llm))
    return shard_parts(root, vision, llm, world_size, device)


def _section(cfg: Config, path: str) -> UpdateConfig | None:
    """The config section at a dotted ``path`` (it has ``vision`` and ``llm``), or None for ``""``."""
    if not path:
        return None
    section: object = cfg
    for key in path.split("."):
        section = getattr(section, key)
    return section  # type: ignore[return-value]
