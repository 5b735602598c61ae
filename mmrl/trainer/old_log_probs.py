"""Where a step's old log-probs come from (``actor.old_log_probs``), decided once for the run.

- ``update``: none are sent; the update's own first forward gives them (an on-policy update, nothing needing them
  before it);
- ``recompute``: the trainer's forward pass over the samples, before the update;
- ``rollout``: the engine's own log-probs of the sampled tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Literal

from mmrl.config import Config
from mmrl.controller import WorkerGroup
from mmrl.protocol import Batch
from mmrl.workers.actor import on_policy

Source = Literal["update", "recompute", "rollout"]


def old_log_prob_source(cfg: Config) -> Source:
    """``actor.old_log_probs`` resolved. ``auto``: ``update`` when the update is on-policy and nothing needs them
    before it (a KL penalty in the reward does, and the rollout correction), else ``recompute``."""
    if cfg.actor.rollout_correction != "none":  # its weights compare the trainer's old log-probs with the engine's
        return "recompute"
    if cfg.actor.old_log_probs == "auto":
        return "update" if on_policy(cfg.actor) and not cfg.algorithm.use_kl_in_reward else "recompute"
    return cfg.actor.old_log_probs


class OldLogProbs:
    """Puts a batch's ``old_log_probs`` (B, R) where the run's source says (none with ``update``)."""

    def __init__(self, cfg: Config, timer: Callable[[str], AbstractContextManager[None]]) -> None:
        self.source, self.timer = old_log_prob_source(cfg), timer

    def add(self, batch: Batch, workers: WorkerGroup) -> Batch:
        """``batch`` with its old log-probs: recomputed by ``workers`` (timed as ``old_log_prob``), or copied from
        ``rollout_log_probs``."""
        if self.source == "recompute":
            with self.timer("old_log_prob"):
                return batch.union(workers.compute_log_probs(batch))
        if self.source == "rollout":
            batch.tensors["old_log_probs"] = batch["rollout_log_probs"]
        return batch
