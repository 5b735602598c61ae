"""The policy side of the hybrid worker: log-probs of responses and the PPO-style update.

Kept apart from Ray so that it can be unit-tested and used in-process; the Ray worker in
:mod:`mmrl.workers.hybrid` owns one of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from mmrl.algos.losses import PolicyLoss, aggregate, kl_penalty, positive_lm_loss
from mmrl.config import ActorConfig
from mmrl.models.logprobs import response_logprobs
from mmrl.parallel.sharding import Layout
from mmrl.protocol import Batch
from mmrl.workers.micro import micro_batches
from mmrl.workers.update import AllReduce, DataParallelUpdater


@dataclass
class LogProbSpec:
    pad_token_id: int
    banned_ids: Sequence[int]
    temperature: float
    micro_batch_size: int
    max_tokens_per_micro: int = 0
    share_prompt: bool = False


def batched_logprobs(
    policy: torch.nn.Module,
    batch: Batch,
    spec: LogProbSpec,
    device: torch.device,
    with_entropy: bool,
    all_reduce: AllReduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """No-grad log-probs and entropy (each (B, R)) of ``batch['responses']``, micro-batch by micro-batch.

    policy: a (possibly sharded) :class:`~mmrl.models.forward.PolicyForward`. ``all_reduce`` (a sum over
    ranks) keeps the micro-batch count equal on all ranks under a token budget.
    """
    batch.require("prompt", "responses", "response_mask")
    logps, entropies = [], []
    with torch.no_grad():
        for micro in micro_batches(batch, spec.micro_batch_size, spec.max_tokens_per_micro, spec.share_prompt,
                                   all_reduce):
            logp, ent = response_logprobs(
                policy, micro["prompt"], micro["responses"], micro["response_mask"],
                pad_token_id=spec.pad_token_id, banned_ids=spec.banned_ids,
                temperature=spec.temperature, device=device, share_prompt=spec.share_prompt,
            )
            logps.append(logp.cpu())
            entropies.append(ent.cpu() if with_entropy else torch.zeros_like(logp).cpu())
    return torch.cat(logps), torch.cat(entropies)


def old_log_prob_source(cfg: ActorConfig, needed_before_update: bool = False) -> Literal["update", "recompute", "rollout"]:
    """Where a step's old log-probs come from (``actor.old_log_probs``): ``update`` when the step is on-policy
    (one epoch, one mini-batch: the policy has not moved when each token's ratio is taken) and nothing needs
    them before the update (a KL penalty in the reward does)."""
    if cfg.old_log_probs == "auto":
        on_policy = cfg.ppo_epochs == 1 and cfg.num_mini_batches == 1
        return "update" if on_policy and not needed_before_update else "recompute"
    return cfg.old_log_probs


class PolicyUpdater(DataParallelUpdater):
    """A policy loss from the loss table (+ optional entropy bonus and KL-to-reference loss) over one
    step's batch."""

    prefix = "actor"
    normalised = ("pg_loss", "positive_lm_loss")

    def __init__(
        self,
        layout: Layout,
        cfg: ActorConfig,
        loss_fn: PolicyLoss,
        spec: LogProbSpec,
        device: torch.device,
        all_reduce: AllReduce,
    ) -> None:
        super().__init__(layout, cfg, device, all_reduce)
        self.loss_fn, self.spec = loss_fn, spec
        self.share_prompt = spec.share_prompt

    def update(self, batch: Batch) -> dict[str, float]:
        """batch: responses, response_mask, old_log_probs, advantages (and ref_log_probs with KL loss)."""
        batch.require("prompt", "responses", "response_mask", "advantages")
        if old_log_prob_source(self.cfg) != "update":
            batch.require("old_log_probs")
        if self.cfg.use_kl_loss:
            batch.require("ref_log_probs")
        if self.cfg.positive_lm_coef:
            batch.require("correct")
        return super().update(batch)

    def micro_loss(self, micro: Batch, denominator: float) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, dev = self.cfg, self.device
        mask = micro["response_mask"].to(dev)
        logp, entropy = response_logprobs(
            self.layout.root, micro["prompt"], micro["responses"], micro["response_mask"],
            pad_token_id=self.spec.pad_token_id, banned_ids=self.spec.banned_ids,
            temperature=self.spec.temperature, device=dev, share_prompt=self.share_prompt,
        )
        # On-policy (old_log_probs=update) the ratio's denominator is this forward's own log-probs, detached.
        old = micro["old_log_probs"].to(dev) if "old_log_probs" in micro.tensors else logp.detach()
        pg_loss, pg_metrics = self.loss_fn(
            logp, old, micro["advantages"].to(dev), mask,
            cfg=cfg, denominator=denominator,
        )
        loss = pg_loss
        tokens = float(mask.sum())
        sums = {key: value * tokens for key, value in pg_metrics.items()}  # per-token means -> sums
        sums["pg_loss"] = float(pg_loss.detach())
        sums["entropy"] = float((entropy.detach() * mask).sum())
        horizon = cfg.loss_horizon
        if cfg.entropy_coeff:
            loss = loss - cfg.entropy_coeff * aggregate(entropy, mask, cfg.loss_agg_mode, denominator, horizon)
        if cfg.use_kl_loss:
            kl = kl_penalty(logp, micro["ref_log_probs"].to(dev), cfg.kl_estimator)
            loss = loss + cfg.kl_loss_coef * aggregate(kl, mask, cfg.loss_agg_mode, denominator, horizon)
            sums["kl_loss"] = float((kl.detach() * mask).sum())
        if cfg.positive_lm_coef:
            # VAPO: imitate the verified-correct samples, over the same denominator as the policy loss.
            lm_loss, _ = positive_lm_loss(logp, mask, micro["correct"].to(dev).bool(), denominator)
            loss = loss + cfg.positive_lm_coef * lm_loss
            sums["positive_lm_loss"] = float(lm_loss.detach())
        return loss, sums
