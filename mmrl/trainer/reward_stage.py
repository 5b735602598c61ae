"""The reward stage: a score for every sample of a step, behind one interface, and the verifier that
decides correctness.

=========  ============================================================================================
type       what scores the samples (``reward.type``)
=========  ============================================================================================
function   reward functions (``reward.function`` or ``reward.weights``: registered names, plugins,
           ``file.py:function``), each sample isolated by :class:`rewards.RewardManager`
=========  ============================================================================================

A reward-model worker group or a generative judge is one more class with ``score(batch) -> (scores,
metrics)`` and one more entry of ``REWARD_STAGES``.

Correctness (val/test accuracy and ``train/acc``) is a separate question from the training reward:
:class:`Verifier` asks ``reward.verifiers[data_source]``, else ``reward.verifier`` (``answer_match`` by default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from PIL import Image

from data_prep.schema import Video, decode_image, decode_video
from mmrl.config import RewardConfig
from mmrl.protocol import Batch
from rewards import RewardInput, RewardManager, by_data_source, resolve


class RewardStage(Protocol):
    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Samples (response_text, answer, data_source, images, extra) -> scores (B,) float32 and metrics."""
        ...


def reward_inputs(batch: Batch) -> list[RewardInput]:
    """One RewardInput per sample; a prompt's images and video frames are decoded once for its n samples."""
    batch.require("response_text", "answer", "data_source", "images", "extra")
    videos = batch["videos"] if "videos" in batch.objects else [[]] * len(batch)
    decoded: dict[int, list[Image.Image]] = {}
    clips: dict[int, list[Video]] = {}
    inputs = []
    for text, answer, source, images, stored, extra in zip(
        batch["response_text"], batch["answer"], batch["data_source"], batch["images"], videos, batch["extra"]
    ):
        if id(images) not in decoded:
            decoded[id(images)] = [decode_image(b) for b in images]
        if id(stored) not in clips:
            clips[id(stored)] = [decode_video(v) for v in stored]
        inputs.append(RewardInput(response=text, ground_truth=answer, data_source=source, images=decoded[id(images)],
                                  videos=clips[id(stored)], extra=extra))
    return inputs


class FunctionRewardStage:
    """Reward functions run per sample; a failing call scores 0 and is counted (``reward/num_*``)."""

    def __init__(self, cfg: RewardConfig) -> None:
        spec = {"weighted": dict(cfg.weights)} if cfg.weights else cfg.function
        self.manager = RewardManager(resolve(spec), timeout_s=cfg.timeout_s)

    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        result = self.manager.score(reward_inputs(batch))
        return torch.tensor(result.scores, dtype=torch.float32), result.metrics()


REWARD_STAGES: dict[str, Callable[[RewardConfig], RewardStage]] = {
    "function": FunctionRewardStage,
}


def build_reward_stage(cfg: RewardConfig) -> RewardStage:
    """The reward stage ``reward.type`` names (validated at config load)."""
    return REWARD_STAGES[cfg.type](cfg)


class Verifier:
    """Correctness of responses, by the verifier configured for each sample's ``data_source``."""

    def __init__(self, cfg: RewardConfig) -> None:
        self.manager = RewardManager(by_data_source(cfg.verifiers, cfg.verifier), timeout_s=cfg.timeout_s)

    def correct(self, batch: Batch) -> list[float]:
        """B verifier scores (1.0 = correct); a verifier that fails on a sample scores it 0."""
        return self.manager.score(reward_inputs(batch)).scores


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """scores (B,), response_mask (B, R) -> (B, R) with each score on its last response token."""
    last = (response_mask.sum(-1).long() - 1).clamp(min=0)
    out = torch.zeros_like(response_mask)
    out[torch.arange(len(scores)), last] = scores
    return out
