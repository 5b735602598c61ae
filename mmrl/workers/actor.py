"""The policy side of the hybrid worker: log-probs of responses and the PPO-style update.

Kept apart from Ray so that it can be unit-tested and used in-process; the Ray worker in
:mod:`mmrl.workers.hybrid` owns one of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mmrl.algos.actor_loss import ActorLoss
from mmrl.algos.aggregation import aggregate
from mmrl.algos.kl import kl_penalty
from mmrl.algos.losses import LOSSES
from mmrl.algos.rollout_correction import IS_WEIGHTS
from mmrl.memory.budget import MicroBatching
from mmrl.config import ActorConfig, UpdateConfig
from mmrl.models.logprobs import response_logprobs
from mmrl.parallel.grads import AllReduce
from mmrl.parallel.sharding import Layout
from mmrl.protocol import Batch
from mmrl.trajectory import policy_mask
from mmrl.workers.micro import FILLER, micro_batches
from mmrl.workers.update import DataParallelUpdater


@dataclass
class LogProbSpec:
    pad_token_id: int
    banned_ids: Sequence[int]
    temperature: float
    micro_batch_size: int
    max_tokens_per_micro: int = 0
    share_prompt: bool = False
    chunk_tokens: int = 0  # of the LM head (actor.logprob_chunk_tokens; 0: automatic)


def batched_logprobs(
    policy: torch.nn.Module,
    batch: Batch,
    spec: LogProbSpec,
    device: torch.device,
    with_entropy: bool,
    all_reduce: AllReduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """No-grad log-probs and, ``with_entropy``, entropy (each (B, R), 0 at holes and padding; else None) of
    ``batch['responses']``, micro-batch by micro-batch.

    policy: a (possibly sharded) :class:`~mmrl.models.forward.PolicyForward`. ``all_reduce`` (a sum over
    ranks) keeps the micro-batch count equal on all ranks under a token budget.
    """
    batch.require("prompt", "responses", "response_mask")
    logps, entropies = [], []
    was_training = policy.training
    policy.eval()  # no dropout (LoRA's) in a scoring pass
    with torch.no_grad():
        for micro in micro_batches(batch, spec.micro_batch_size, spec.max_tokens_per_micro, spec.share_prompt,
                                   all_reduce):
            logp, ent = response_logprobs(
                policy, micro["prompt"], micro["responses"], micro["response_mask"],
                pad_token_id=spec.pad_token_id, banned_ids=spec.banned_ids,
                temperature=spec.temperature, device=device, share_prompt=spec.share_prompt,
                policy_mask=micro.tensors.get("policy_mask"), with_entropy=with_entropy,
                chunk_tokens=spec.chunk_tokens,
            )
            if micro.meta.get(FILLER):
                continue
            logps.append(logp.cpu())
            if ent is not None:
                entropies.append(ent.cpu())
    policy.train(was_training)
    return torch.cat(logps), torch.cat(entropies) if with_entropy else None


def on_policy(cfg: UpdateConfig) -> bool:
    """Whether an update's own forward gives the old log-probs: one epoch of one mini-batch, so the policy has
    not moved when each token's ratio is taken."""
    return cfg.ppo_epochs == 1 and cfg.num_mini_batches == 1


class PolicyUpdater(DataParallelUpdater):
    """The loss terms of an :class:`~mmrl.algos.actor_loss.ActorLoss` (a policy loss and extra losses from the
    loss table), plus an optional entropy bonus and KL-to-reference loss, over one step's batch."""

    prefix = "actor"
    lm_head = True

    def __init__(
        self,
        layout: Layout,
        cfg: ActorConfig,
        loss: ActorLoss,
        spec: LogProbSpec,
        device: torch.device,
        all_reduce: AllReduce,
        micro: MicroBatching | None = None,
    ) -> None:
        super().__init__(layout, cfg, device, all_reduce, micro)
        self.loss, self.spec = loss, spec
        self.policy_loss = LOSSES[loss.policy]
        self.extra_losses = [(name, LOSSES[name], coef) for name, coef in loss.extras]
        # Every term is divided by the global denominator already: its micro-batch values add up to its mean.
        self.normalised = ("pg_loss", *(f"{name}_loss" for name, _, _ in self.extra_losses))
        self.share_prompt = spec.share_prompt

    def update(self, batch: Batch) -> dict[str, float]:
        """batch: prompt, responses, response_mask, advantages, the fields the loss terms read
        (:attr:`ActorLoss.fields`), ref_log_probs with the KL loss, old_log_probs when the driver took them
        before the update, policy_mask when the responses have holes, and rollout_is_weights (B, R) with the
        rollout correction (each token's policy-gradient term is weighted by it). Without old_log_probs the ratio's
        denominator is this update's own forward, which only an on-policy update (:func:`on_policy`) may do."""
        batch.require("prompt", "responses", "response_mask", "advantages", *self.loss.fields)
        if not on_policy(self.cfg):
            batch.require("old_log_probs")
        if self.cfg.use_kl_loss:
            batch.require("ref_log_probs")
        return super().update(batch)

    def loss_inputs(self, name: str, micro: Batch) -> dict[str, torch.Tensor]:
        """The batch fields the table loss ``name`` reads beyond the common ones, on the device, by keyword."""
        return {field: micro[field].to(self.device) for field in LOSSES[name].fields}

    def micro_loss(self, micro: Batch, denominator: float) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, dev = self.cfg, self.device
        mask = policy_mask(micro).to(dev)  # the loss counts the policy's tokens; the forward sees the extent
        logp, entropy = response_logprobs(
            self.layout.root, micro["prompt"], micro["responses"], micro["response_mask"],
            pad_token_id=self.spec.pad_token_id, banned_ids=self.spec.banned_ids,
            temperature=self.spec.temperature, device=dev, share_prompt=self.share_prompt,
            policy_mask=micro.tensors.get("policy_mask"), with_entropy=bool(cfg.entropy_coeff),
            chunk_tokens=self.spec.chunk_tokens,
        )
        # On-policy (old_log_probs=update) the ratio's denominator is this forward's own log-probs, detached.
        old = micro["old_log_probs"].to(dev) if "old_log_probs" in micro.tensors else logp.detach()
        advantages = micro["advantages"].to(dev)
        if IS_WEIGHTS in micro.tensors:  # the rollout correction: see mmrl.algos.rollout_correction
            advantages = advantages * micro[IS_WEIGHTS].to(dev)
        pg_loss, pg_metrics = self.policy_loss(
            logp, old, advantages, mask,
            cfg=cfg, denominator=denominator, **self.loss_inputs(self.loss.policy, micro),
        )
        loss = pg_loss
        tokens = float(mask.sum())
        sums = {key: value * tokens for key, value in pg_metrics.items()}  # per-token means -> sums
        sums["pg_loss"] = float(pg_loss.detach())
        horizon = cfg.loss_horizon
        if entropy is not None:  # only with the bonus; the step's actor/entropy is the log-prob pass's
            sums["entropy_update"] = float((entropy.detach() * mask).sum())
            loss = loss - cfg.entropy_coeff * aggregate(entropy, mask, cfg.loss_agg_mode, denominator, horizon)
        if cfg.use_kl_loss:
            kl = kl_penalty(logp, micro["ref_log_probs"].to(dev), cfg.kl_estimator)
            loss = loss + cfg.kl_loss_coef * aggregate(kl, mask, cfg.loss_agg_mode, denominator, horizon)
            sums["kl_loss"] = float((kl.detach() * mask).sum())
        for name, extra_loss, coef in self.extra_losses:
            extra, extra_metrics = extra_loss(logp, mask, cfg=cfg, denominator=denominator,
                                              **self.loss_inputs(name, micro))
            loss = loss + coef * extra
            sums |= {key: value * tokens for key, value in extra_metrics.items()}
            sums[f"{name}_loss"] = float(extra.detach())
        return loss, sums
