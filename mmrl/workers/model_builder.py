"""``build_model(cfg, role, checkpoint)``: the one load -> wrap -> freeze -> lay out sequence.

===========  ==================  ===================  =================================================
role         module              layout from          trainable parameters
===========  ==================  ===================  =================================================
actor        PolicyForward       actor.vision / llm   all, but the vision tower when actor.vision.freeze
reference    PolicyForward       actor.vision / llm   none (eval mode): the frozen KL anchor
critic       ValueModel          critic.vision / llm  all (backbone + a new zero value head), but the
                                                      vision tower when critic.vision.freeze
===========  ==================  ===================  =================================================

A new role (a reward model, a LoRA actor) is one more entry of ``ROLES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from mmrl.config import Config, PartConfig, UpdateConfig, VisionPartConfig
from mmrl.models.forward import PolicyForward, ValueModel
from mmrl.models.loading import load_model
from mmrl.parallel.sharding import Layout, shard_parts

Role = Literal["actor", "reference", "critic"]


@dataclass(frozen=True)
class RoleSpec:
    wrap: Callable[[nn.Module], nn.Module]
    """Hugging Face model -> the root module the workers run (and FSDP shards)."""
    section: Literal["actor", "critic"]
    """The config section whose ``vision`` / ``llm`` layouts apply."""
    trainable: bool


ROLES: dict[str, RoleSpec] = {
    "actor": RoleSpec(PolicyForward, "actor", trainable=True),
    "reference": RoleSpec(PolicyForward, "actor", trainable=False),
    "critic": RoleSpec(ValueModel.from_policy, "critic", trainable=True),
}


def build_model(
    cfg: Config, role: Role, checkpoint: str, *, device: torch.device, world_size: int = 1, distributed: bool = True
) -> Layout:
    """Load ``checkpoint`` as ``role`` and lay it out over ``world_size`` ranks.

    Every rank of a group calls it with the same arguments (sharding runs collectives). With
    ``distributed=False`` (a single process without a process group: SFT, tests) both parts stay
    replicated whatever the config says.
    """
    if role not in ROLES:
        raise ValueError(f"unknown model role {role!r}; allowed: {', '.join(ROLES)}")
    spec = ROLES[role]
    section: UpdateConfig = getattr(cfg, spec.section)
    model = load_model(checkpoint, cfg.model.dtype, cfg.model.attn_implementation, device)
    root = spec.wrap(model).to(device)
    if not spec.trainable:
        root.eval().requires_grad_(False)
    elif section.vision.freeze:
        root.core.visual.requires_grad_(False)
    vision, llm = (section.vision, section.llm) if distributed else (VisionPartConfig(), PartConfig())
    return shard_parts(root, vision, llm, world_size, device)
