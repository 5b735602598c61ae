"""The policy side of the hybrid worker: log-probs of responses and the PPO-style update.

Kept apart from Ray so that it can be unit-tested and used in-process; the Ray worker in
:mod:`mmrl.workers.hybrid` owns one of these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from mmrl.algos.losses import aggregate, kl_penalty, ppo_clip_loss
from mmrl.config import ActorConfig
from mmrl.models.logprobs import response_logprobs
from mmrl.protocol import Batch, balanced_sizes

AllReduce = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class LogProbSpec:
    pad_token_id: int
    banned_ids: Sequence[int]
    temperature: float
    micro_batch_size: int


def batched_logprobs(
    model: torch.nn.Module, batch: Batch, spec: LogProbSpec, device: torch.device, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """No-grad log-probs and entropy (each (B, R)) of ``batch['responses']``, micro-batch by micro-batch."""
    batch.require("prompt", "responses", "response_mask")
    logps, entropies = [], []
    with torch.no_grad():
        for start in range(0, len(batch), spec.micro_batch_size):
            micro = batch.slice(start, start + spec.micro_batch_size)
            logp, ent = response_logprobs(
                model, micro["prompt"], micro["responses"], micro["response_mask"],
                pad_token_id=spec.pad_token_id, banned_ids=spec.banned_ids,
                temperature=spec.temperature, device=device,
            )
            logps.append(logp.cpu())
            entropies.append(ent.cpu() if with_entropy else torch.zeros_like(logp).cpu())
    return torch.cat(logps), torch.cat(entropies)


def build_optimizer(
    model: torch.nn.Module, lr: float, weight_decay: float, warmup_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW over trainable parameters only (a frozen part holds no optimizer state); linear warm-up."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999))
    warmup = max(warmup_steps, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    return optimizer, scheduler


class PolicyUpdater:
    """Runs PPO epochs over mini-batches of one step's batch, data-parallel over ranks.

    Each rank holds a slice of the batch. Losses are normalised by the *global* token (or sequence)
    count of the mini-batch and gradients are summed over ranks, so N ranks compute exactly the update
    that one rank would on the whole mini-batch.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: ActorConfig,
        spec: LogProbSpec,
        device: torch.device,
        all_reduce: AllReduce,
    ) -> None:
        self.model, self.cfg, self.spec, self.device = model, cfg, spec, device
        self.all_reduce = all_reduce
        self.optimizer, self.scheduler = build_optimizer(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps)

    def update(self, batch: Batch) -> dict[str, float]:
        """batch: responses, response_mask, old_log_probs, advantages (and ref_log_probs with KL loss)."""
        batch.require("prompt", "responses", "response_mask", "old_log_probs", "advantages")
        if self.cfg.use_kl_loss:
            batch.require("ref_log_probs")
        self.model.train()
        totals: dict[str, float] = {}
        num_updates = 0
        for _ in range(self.cfg.ppo_epochs):
            for mini in batch.split(balanced_sizes(len(batch), self.cfg.num_mini_batches)):
                for key, value in self._update_mini_batch(mini).items():
                    totals[key] = totals.get(key, 0.0) + value
                num_updates += 1
        metrics = {f"actor/{k}": v / num_updates for k, v in totals.items()}
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        return metrics

    def _denominator(self, mini: Batch) -> float:
        mask = mini["response_mask"]
        local = mask.sum() if self.cfg.loss_agg_mode == "token-mean" else torch.tensor(float(mask.shape[0]))
        return float(self.all_reduce(local.clone().double()))

    def _update_mini_batch(self, mini: Batch) -> dict[str, float]:
        denominator = self._denominator(mini)
        tokens = float(self.all_reduce(mini["response_mask"].sum().clone().double()))
        self.optimizer.zero_grad(set_to_none=True)
        # Partial sums of this rank's share of each metric; summed over ranks below.
        sums = torch.zeros(5, dtype=torch.float64)
        for start in range(0, len(mini), self.cfg.micro_batch_size):
            micro = mini.slice(start, start + self.cfg.micro_batch_size)
            loss, parts = self._micro_loss(micro, denominator, tokens)
            loss.backward()
            sums += torch.tensor(parts, dtype=torch.float64)
        grad_norm = self._sync_and_clip()
        self.optimizer.step()
        self.scheduler.step()
        self.all_reduce(sums)
        pg_loss, clip_tokens, kl_tokens, entropy_sum, ref_kl_sum = sums.tolist()
        return {
            "pg_loss": pg_loss,
            "pg_clipfrac": clip_tokens / tokens,
            "ppo_kl": kl_tokens / tokens,
            "entropy": entropy_sum / tokens,
            "kl_loss": ref_kl_sum / tokens,
            "grad_norm": grad_norm,
        }

    def _micro_loss(self, micro: Batch, denominator: float, tokens: float) -> tuple[torch.Tensor, list[float]]:
        cfg, dev = self.cfg, self.device
        mask = micro["response_mask"].to(dev)
        logp, entropy = response_logprobs(
            self.model, micro["prompt"], micro["responses"], micro["response_mask"],
            pad_token_id=self.spec.pad_token_id, banned_ids=self.spec.banned_ids,
            temperature=self.spec.temperature, device=dev,
        )
        pg_loss, pg_metrics = ppo_clip_loss(
            logp, micro["old_log_probs"].to(dev), micro["advantages"].to(dev), mask,
            clip_low=cfg.clip_ratio_low, clip_high=cfg.clip_ratio_high,
            agg_mode=cfg.loss_agg_mode, denominator=denominator,
        )
        loss = pg_loss
        local_tokens = float(mask.sum())
        if cfg.entropy_coeff:
            loss = loss - cfg.entropy_coeff * aggregate(entropy, mask, cfg.loss_agg_mode, denominator)
        ref_kl_sum = 0.0
        if cfg.use_kl_loss:
            kl = kl_penalty(logp, micro["ref_log_probs"].to(dev), cfg.kl_estimator)
            loss = loss + cfg.kl_loss_coef * aggregate(kl, mask, cfg.loss_agg_mode, denominator)
            ref_kl_sum = float((kl.detach() * mask).sum())
        parts = [
            float(pg_loss.detach()),
            pg_metrics["pg_clipfrac"] * local_tokens,
            pg_metrics["ppo_kl"] * local_tokens,
            float((entropy.detach() * mask).sum()),
            ref_kl_sum,
        ]
        return loss, parts

    def _sync_and_clip(self) -> float:
        """Sum gradients over ranks (one flat buffer), then clip; returns the pre-clip global norm."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            return 0.0
        for p in params:
            # A part this rank did not use (the vision encoder on a text-only slice) still joins the sum.
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        self.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        return float(torch.nn.utils.clip_grad_norm_(params, clip))
