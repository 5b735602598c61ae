"""The reward stage: a score for every sample of a step, and the verifier that decides correctness.

The training reward is a weighted sum of up to three parts, each behind ``score(batch) -> (scores, metrics)``:

=============  =====================================================  ==========================
part           what scores the samples                                configured by
=============  =====================================================  ==========================
rules          reward functions (registered verifiers, plugins,       ``reward.function`` or
               ``file.py:function``), isolated in worker processes    ``reward.weights``
model          a reward-model worker group (a VLM with a scalar       ``reward.model.path``,
               head, trained by ``make rm``)                          ``reward.model.weight``
judge          a generative judge worker group (a VLM asked whether   ``reward.judge.path``,
               the response is correct, through a rollout engine)     ``reward.judge.weight``
=============  =====================================================  ==========================

Correctness (val/test accuracy and ``train/acc``) is a separate question from the training reward:
:class:`Verifier` asks ``reward.verifiers[data_source]``, else ``reward.verifier`` (``answer_match``).
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch
from PIL import Image

from mmrl.config import RewardConfig
from mmrl.controller import WorkerGroup
from mmrl.protocol import Batch
from mmrl.schema import Video, decode_image, decode_video
from rewards import RewardInput, RewardManager

log = logging.getLogger(__name__)


class RewardFailure(RuntimeError):
    """The reward could not score a run's samples: training on its zeros would teach nothing."""


class RewardStage(Protocol):
    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Samples -> scores (B,) float32 and metrics."""
        ...


def model_image_size(grid_thw: torch.Tensor, patch_size: int) -> tuple[int, int]:
    """(width, height) in pixels of an image the processor resized to a (1, h, w) patch grid."""
    return int(grid_thw[2]) * patch_size, int(grid_thw[1]) * patch_size


def reward_inputs(batch: Batch, max_response_tokens: int = 0, patch_size: int = 0) -> list[RewardInput]:
    """One RewardInput per sample; a prompt's images and video frames are decoded once for its n samples.

    ``patch_size`` (the vision tower's, in pixels) gives each image's size as the model saw it
    (``model_image_sizes``) from the prompt's ``image_grid_thw``; 0 leaves them unknown.
    """
    batch.require("response_text", "answer", "data_source", "images", "extra")
    count = len(batch)
    videos = batch["videos"] if "videos" in batch.objects else [[]] * count
    messages = batch["messages"] if "messages" in batch.objects else [[]] * count
    encoded = batch["prompt"] if "prompt" in batch.objects else [None] * count
    lengths = batch["response_mask"].sum(-1).long().tolist() if "response_mask" in batch.tensors else [0] * count
    decoded: dict[int, list[Image.Image]] = {}
    clips: dict[int, list[Video]] = {}
    inputs = []
    for i in range(count):
        images, stored = batch["images"][i], videos[i]
        if id(images) not in decoded:
            decoded[id(images)] = [decode_image(b) for b in images]
        if id(stored) not in clips:
            clips[id(stored)] = [decode_video(v) for v in stored]
        grids = getattr(encoded[i], "image_grid_thw", None)
        sizes = [model_image_size(g, patch_size) for g in grids] if grids is not None and patch_size else []
        inputs.append(RewardInput(
            response=batch["response_text"][i], ground_truth=batch["answer"][i], data_source=batch["data_source"][i],
            images=decoded[id(images)], videos=clips[id(stored)], extra=batch["extra"][i],
            prompt=prompt_text(messages[i]), model_image_sizes=sizes, response_tokens=int(lengths[i]),
            max_response_tokens=max_response_tokens,
        ))
    return inputs


def prompt_text(messages: list[dict]) -> str:
    """The text of the prompt's user turns (media placeholders included)."""
    return "\n".join(m["content"] for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str))


class RuleReward:
    """Reward functions, each call isolated (``reward.isolation``); failures score 0 and are counted.

    Every step whose every sample had a failed call counts towards ``reward.max_failed_steps``; a step
    with at least one clean sample resets the count.
    """

    def __init__(self, cfg: RewardConfig, max_response_tokens: int = 0, patch_size: int = 0) -> None:
        spec = dict(cfg.weights) if cfg.weights else cfg.function
        self.manager = RewardManager(spec, timeout_s=cfg.timeout_s, num_workers=cfg.num_workers,
                                     max_memory_mb=cfg.max_memory_mb, max_abs_score=cfg.max_abs_score,
                                     isolation=cfg.isolation)
        self.max_failed_steps = cfg.max_failed_steps
        self.max_response_tokens, self.patch_size = max_response_tokens, patch_size
        self.failed_steps = 0

    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        result = self.manager.score(reward_inputs(batch, self.max_response_tokens, self.patch_size))
        self.failed_steps = self.failed_steps + 1 if result.failed and all(result.failed) else 0
        if self.failed_steps >= self.max_failed_steps:
            raise RewardFailure(
                f"every sample of the last {self.failed_steps} steps had a failed reward call "
                f"(reward.max_failed_steps={self.max_failed_steps}); first errors: {result.errors[:3]}. Fix the "
                "reward function (run it on a few rows by hand), or raise reward.timeout_s / reward.max_memory_mb"
            )
        return torch.tensor(result.scores, dtype=torch.float32), result.metrics("reward")

    def close(self) -> None:
        self.manager.close()


class ModelReward:
    """Scores from a reward-model worker group (``RewardModelWorker.compute_rm_scores``)."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        scores = self.group.compute_rm_scores(batch)["rm_scores"].float()
        return scores, {"reward/model/score": float(scores.mean()), "reward/model/std": float(scores.std(unbiased=False))}


class JudgeReward:
    """Verdicts of a generative judge worker group (``JudgeWorker.judge``): 1 yes, 0 no or unparsable."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        out = self.group.judge(batch)
        scores, parsed = out["judge_scores"].float(), out["judge_parsed"]
        unparsable = int((parsed == 0).sum())
        if unparsable:
            log.warning("the judge gave no yes/no verdict on %d of %d samples (scored 0), e.g. %r",
                        unparsable, len(parsed), out["judge_text"][int((parsed == 0).nonzero()[0])])
        return scores, {"reward/judge/score": float(scores.mean()), "reward/judge/unparsable": float(unparsable)}


class CombinedReward:
    """The weighted sum of the configured parts; ``reward/score/total`` is the training reward's mean."""

    def __init__(self, parts: list[tuple[str, float, RewardStage]]) -> None:
        if not parts:
            raise ValueError("the reward has no part: set reward.function, reward.model.path or reward.judge.path")
        self.parts = parts

    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        total = torch.zeros(len(batch))
        metrics: dict[str, float] = {}
        for _name, weight, part in self.parts:
            scores, part_metrics = part.score(batch)
            total += weight * scores
            metrics |= part_metrics
        metrics["reward/score/total"] = float(total.mean())
        return total, metrics


class Verifier:
    """Correctness of responses, by the verifier configured for each sample's ``data_source``."""

    def __init__(self, cfg: RewardConfig, patch_size: int = 0) -> None:
        self.patch_size = patch_size
        spec = {"by_data_source": dict(cfg.verifiers), "default": cfg.verifier}
        self.manager = RewardManager(spec, timeout_s=cfg.timeout_s, num_workers=cfg.num_workers,
                                     max_memory_mb=cfg.max_memory_mb, max_abs_score=cfg.max_abs_score,
                                     isolation=cfg.isolation)

    def correct(self, batch: Batch) -> list[float]:
        """B verifier scores (1.0 = correct); a verifier that fails on a sample scores it 0."""
        return self.manager.score(reward_inputs(batch, patch_size=self.patch_size)).scores

    def close(self) -> None:
        self.manager.close()


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """scores (B,), response_mask (B, R) -> (B, R) with each score on its last response token."""
    last = (response_mask.sum(-1).long() - 1).clamp(min=0)
    out = torch.zeros_like(response_mask)
    out[torch.arange(len(scores)), last] = scores
    return out
