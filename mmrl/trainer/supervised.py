"""The single-process training loop the supervised stages share (``make sft``, ``make rm``).

Batches of item indices are drawn without replacement and reshuffled each epoch (one ``random.Random(seed)``),
one optimizer step per batch, the gradient norm clipped; ``<name>/loss``, ``grad_norm``, ``lr`` and the step
function's own metrics are logged every step, with a progress bar.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch
from tqdm import tqdm

from mmrl.config import OptimConfig
from mmrl.trainer.tracking import Tracker
from mmrl.workers.update import build_optimizer

StepFn = Callable[[list[int]], tuple[torch.Tensor, dict[str, float]]]


def train_steps(name: str, cfg: OptimConfig, params: Sequence[torch.nn.Parameter], num_items: int, seed: int,
                step_fn: StepFn, tracker: Tracker) -> None:
    """``cfg.steps`` optimizer steps; ``step_fn(indices)`` returns the batch's loss and extra metrics."""
    optimizer, scheduler = build_optimizer(params, cfg.lr, cfg.weight_decay, cfg.warmup_steps,
                                           cfg.steps if cfg.lr_schedule == "cosine" else 0, cfg.min_lr_ratio)
    rng = random.Random(seed)
    order: list[int] = []
    bar = tqdm(range(1, cfg.steps + 1), desc=name, dynamic_ncols=True)
    for step in bar:
        if len(order) < cfg.batch_size:
            order += rng.sample(range(num_items), num_items)
        indices, order = order[: cfg.batch_size], order[cfg.batch_size :]
        loss, metrics = step_fn(indices)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        loss_value = loss.item()
        logged = {"loss": loss_value, **metrics, "grad_norm": float(grad_norm), "lr": scheduler.get_last_lr()[0]}
        tracker.log_metrics({f"{name}/{k}": v for k, v in logged.items()}, step)
        bar.set_postfix(loss=f"{loss_value:.3f}", **{k: f"{v:.2f}" for k, v in metrics.items()})
