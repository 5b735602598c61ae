"""The rollout sources, by ``trainer.mode``: where a step's samples come from (:mod:`.base` gives the seam).

To add one (say a remote inference service), write a :class:`~mmrl.trainer.sources.base.RolloutSource` subclass
in its own module and add one line here.
"""

from __future__ import annotations

from mmrl.config import Config
from mmrl.rollout.sampling import SamplingParams
from mmrl.trainer.sources.base import RolloutSource
from mmrl.trainer.sources.hybrid import HybridRollouts
from mmrl.trainer.sources.pool import PoolRollouts

SOURCES: dict[str, type[RolloutSource]] = {
    "sync": HybridRollouts,
    "async": PoolRollouts,
}



def build_source(cfg: Config, checkpoint: str, params: SamplingParams) -> RolloutSource:
    """The rollout source ``trainer.mode`` names."""
    return SOURCES[cfg.trainer.mode](cfg, checkpoint, params)


__all__ = ["SOURCES", "build_source", "HybridRollouts", "PoolRollouts", "RolloutSource"]
