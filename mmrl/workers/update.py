"""The data-parallel update loop shared by the actor and the critic.

Each rank holds an equal-size slice of a step's batch (padded rows carry a zero response mask). For each
epoch and mini-batch: losses are normalised by the mini-batch's *global* count of the policy's tokens
(:mod:`mmrl.trajectory`) or of sequences, the micro-batch gradients accumulate, replicated gradients are
summed over ranks (FSDP sums the sharded ones), the global norm is clipped, and the optimizer steps. N ranks
thus compute exactly the update one rank would compute on the whole mini-batch. A non-finite loss (on any
rank) or gradient norm skips the optimizer step on every rank: nothing non-finite reaches the weights
(counted as ``skipped_updates``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from mmrl.memory.budget import MicroBatching, ModelDims, memory_at_hand, training_state_bytes, update_batching
from mmrl.config import UpdateConfig
from mmrl.parallel.grads import AllReduce, clip_grad_norm, sum_replicated_grads
from mmrl.parallel.sharding import Layout
from mmrl.protocol import Batch
from mmrl.trajectory import policy_mask
from mmrl.workers.micro import micro_batches, mini_batches

log = logging.getLogger(__name__)


def lr_factor(step: int, warmup_steps: int, decay_steps: int, min_ratio: float) -> float:
    """The learning rate's multiplier at optimizer step ``step`` (0-based): linear warm-up over
    ``warmup_steps``, then constant (``decay_steps`` 0) or a cosine from 1 down to ``min_ratio`` at
    ``decay_steps`` (and ``min_ratio`` after)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / (decay_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(
    params: Sequence[torch.nn.Parameter], lr: float, weight_decay: float, warmup_steps: int,
    decay_steps: int = 0, min_lr_ratio: float = 0.0,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW over the given (trainable) parameters; linear warm-up, then constant or (``decay_steps`` > 0)
    a cosine decay to ``min_lr_ratio * lr`` (:func:`lr_factor`).

    Sharded (DTensor) and plain parameters go in separate groups so the fused per-group kernels never
    mix the two. Fused: the step holds no temporaries, where the defaults hold parameter-sized ones (CPU's
    per-tensor loop two of the largest tensor, 2.3 GiB for a 151,936 x 2048 embedding; CUDA's foreach one of
    every tensor).
    """
    from torch.distributed.tensor import DTensor

    sharded = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    groups = [{"params": g} for g in (sharded, plain) if g]
    optimizer = torch.optim.AdamW(groups or [{"params": []}], lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999),
                                  fused=True)
    warmup = max(warmup_steps, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup, decay_steps, min_lr_ratio))
    return optimizer, scheduler


def real_rows(batch: Batch) -> torch.Tensor:
    """(B,) float: 1 for real samples, 0 for the padding rows the dispatcher added."""
    if "is_pad" in batch.tensors:
        return (~batch["is_pad"].bool()).float()
    return torch.ones(len(batch))


class DataParallelUpdater:
    """Subclasses define :meth:`micro_loss`; its metrics are sums that the updater adds over micro-batches
    and ranks, then divides by the mini-batch's count of policy tokens (except the ``normalised`` ones, which
    already carry the global denominator)."""

    prefix = ""
    normalised: tuple[str, ...] = ()
    share_prompt = False  # whether the forward packs the samples of a prompt (counts its tokens once)
    lm_head = False  # whether the loss scores tokens with the LM head (its logits' chunk counts in the budget)

    def __init__(self, layout: Layout, cfg: UpdateConfig, device: torch.device, all_reduce: AllReduce,
                 micro: MicroBatching | None = None) -> None:
        """``micro``: the update's micro-batching; None: ``cfg``'s settings, or a token budget sized from the model
        and the memory at hand now (:func:`mmrl.memory.budget.update_batching`)."""
        self.layout, self.cfg, self.device, self.all_reduce = layout, cfg, device, all_reduce
        self.micro = micro or update_batching(
            cfg, ModelDims.of(layout.root.core, lm_head=self.lm_head),
            memory_at_hand(device) - training_state_bytes(layout.trainable()))
        self.rows = 0  # rows of the batch being updated (the same on every rank)
        self.optimizer, self.scheduler = build_optimizer(
            layout.trainable(), cfg.lr, cfg.weight_decay, cfg.warmup_steps,
            cfg.decay_steps if cfg.lr_schedule == "cosine" else 0, cfg.min_lr_ratio,
        )

    def update(self, batch: Batch) -> dict[str, float]:
        """``ppo_epochs`` passes of mini-batch updates; returns metrics identical on every rank."""
        self.layout.root.train()
        self.rows = len(batch)  # the same on every rank: bounds the micro-batch counts of every mini-batch
        totals: dict[str, float] = {}
        num_updates = 0
        for _ in range(self.cfg.ppo_epochs):
            for mini in mini_batches(batch, self.cfg.num_mini_batches):
                for key, value in self.update_mini_batch(mini).items():
                    totals[key] = totals.get(key, 0.0) + value
                num_updates += 1
        # Means over the mini-batch updates, but the count of skipped ones.
        metrics = {f"{self.prefix}/{k}": v if k == "skipped_updates" else v / num_updates for k, v in totals.items()}
        metrics[f"{self.prefix}/lr"] = self.scheduler.get_last_lr()[0]
        return metrics

    def global_count(self, local: torch.Tensor | float) -> float:
        return float(self.all_reduce(torch.as_tensor(local, dtype=torch.float64).clone()))

    def denominator(self, mini: Batch) -> float:
        """Global count the loss is divided by: the policy's tokens (token-mean) or real sequences."""
        if self.cfg.loss_agg_mode == "token-mean":
            return self.global_count(policy_mask(mini).sum())
        return self.global_count(real_rows(mini).sum())

    def update_mini_batch(self, mini: Batch) -> dict[str, float]:
        denominator = self.denominator(mini)
        tokens = max(self.global_count(policy_mask(mini).sum()), 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}  # this rank's partial sums of each metric; summed over ranks below
        non_finite_losses = 0
        for micro in micro_batches(mini, self.micro.rows, self.micro.tokens, self.share_prompt, self.all_reduce,
                                   slots=self.rows):
            loss, parts = self.micro_loss(micro, denominator)
            loss.backward()
            non_finite_losses += not math.isfinite(float(loss.detach()))
            for key, value in parts.items():
                sums[key] = sums.get(key, 0.0) + value
        sum_replicated_grads(self.layout.replicated, self.all_reduce)
        grad_norm = clip_grad_norm(self.layout.trainable(), self.cfg.grad_clip)
        # Every rank takes the same decision: the loss count is summed, the norm is already global.
        skip = self.global_count(non_finite_losses) > 0 or not math.isfinite(grad_norm)
        if skip:
            log.warning("%s: non-finite %s; this mini-batch update is skipped", self.prefix,
                        "loss" if non_finite_losses else f"gradient norm ({grad_norm})")
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            self.scheduler.step()
        keys = sorted(sums)  # every rank runs the same code on as many micro-batches: the same keys
        totals = self.all_reduce(torch.tensor([sums[k] for k in keys], dtype=torch.float64))
        metrics = {k: v if k in self.normalised else v / tokens for k, v in zip(keys, totals.tolist())}
        metrics["grad_norm"] = grad_norm
        metrics["skipped_updates"] = float(skip)
        return metrics

    def micro_loss(self, micro: Batch, denominator: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's loss (normalised by ``denominator``) and its metric sums."""
        raise NotImplementedError
