"""Score samples with the configured reward function (the driver's reward stage)."""

from __future__ import annotations

import torch

from data_prep.schema import decode_image
from mmrl.config import RewardConfig
from mmrl.protocol import Batch
from rewards import RewardInput, RewardManager, resolve


def build_reward_manager(cfg: RewardConfig) -> RewardManager:
    spec = {"weighted": dict(cfg.weights)} if cfg.weights else cfg.function
    return RewardManager(resolve(spec), timeout_s=cfg.timeout_s)


def reward_inputs(batch: Batch) -> list[RewardInput]:
    """One RewardInput per sample; a prompt's images are decoded once for its n samples."""
    batch.require("response_text", "answer", "data_source", "images", "extra")
    decoded: dict[int, list] = {}
    inputs = []
    for text, answer, source, images, extra in zip(
        batch["response_text"], batch["answer"], batch["data_source"], batch["images"], batch["extra"]
    ):
        if id(images) not in decoded:
            decoded[id(images)] = [decode_image(b) for b in images]
        inputs.append(
            RewardInput(response=text, ground_truth=answer, data_source=source, images=decoded[id(images)], extra=extra)
        )
    return inputs


def score_samples(manager: RewardManager, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """-> scores (B,) and reward metrics (means of components, failure counts)."""
    result = manager.score(reward_inputs(batch))
    return torch.tensor(result.scores, dtype=torch.float32), result.metrics()


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """scores (B,), response_mask (B, R) -> (B, R) with each score on its last response token."""
    last = (response_mask.sum(-1).long() - 1).clamp(min=0)
    out = torch.zeros_like(response_mask)
    out[torch.arange(len(scores)), last] = scores
    return out
