"""Dual-clip PPO (Ye et al., 2020): :func:`~mmrl.algos.losses.ppo_clip.ppo_clip_loss` with the loss of
negative-advantage tokens bounded by ``-A * clip_ratio_c``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmrl.algos.losses.ppo_clip import ppo_clip_loss
from mmrl.algos.losses.spec import ActorKeys, LossSpec, clip_settings
from mmrl.config_fields import num


@dataclass(kw_only=True)
class DualClipConfig:
    """Dual-clip PPO (``actor.loss.policy=dual_clip``); the clip range is ``actor.clip_ratio_low/high``."""

    clip_ratio_c: float = num(3.0, gt=1)
    """The bound on the loss of negative-advantage tokens, ``-A * c``."""


def settings(actor: ActorKeys, own: DualClipConfig) -> dict[str, Any]:
    return {**clip_settings(actor), "clip_ratio_c": own.clip_ratio_c}


SPEC = LossSpec("dual_clip", ppo_clip_loss, section=DualClipConfig, settings=settings, linear=True)
