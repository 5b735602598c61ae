"""The reward stage: the training reward of every sample of a step, and whether each one is correct.

One :class:`RewardStage` per run. The training reward is the weighted sum of up to three parts:

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

Correctness (val/test accuracy and ``train/acc``) is a separate question from the training reward: the
verifier of a sample is ``reward.verifiers[data_source]``, else ``reward.verifier`` (``answer_match``).
Every reward function, of the rules or a verifier, runs in the stage's one pool of worker processes, and
one that serves both is called once per sample.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from PIL import Image

from mmrl.config import RewardConfig
from mmrl.controller import WorkerGroup
from mmrl.protocol import Batch
from mmrl.schema import Video, decode_image, decode_video
from rewards import FunctionResult, RewardInput, RewardManager, prompt_text

log = logging.getLogger(__name__)


class RewardFailure(RuntimeError):
    """The reward could not score a run's samples: training on its zeros would teach nothing."""


@dataclass
class RewardScores:
    """What the reward stage says of a batch of B samples."""

    scores: torch.Tensor  # (B,) float32: the training reward, the weighted sum of the parts
    correct: torch.Tensor  # (B,) float32: the verifier's verdict, 1 = correct
    metrics: dict[str, float]  # reward/..., train/acc


def weighted_sum(terms: Sequence[tuple[float, torch.Tensor]], count: int) -> torch.Tensor:
    """(B,) float32: the sum of weight x scores over ``terms`` of (weight, scores (B,)), added in float64."""
    total = torch.zeros(count, dtype=torch.float64)
    for weight, scores in terms:
        total += weight * scores.double()
    return total.float()


class RewardStage:
    """The training reward and the verifier of a run, over one pool of reward worker processes.

    ``max_response_tokens`` (the generation limit) and ``patch_size`` (the vision tower's, in pixels)
    fill the reward functions' inputs of those names; ``model`` and ``judge`` are the reward-model and
    judge worker groups, when configured (:meth:`connect` gives new ones after a recovery). Every step
    whose every sample had a failed call of a rule counts towards ``reward.max_failed_steps``; a step
    with at least one clean sample resets the count.
    """

    def __init__(self, cfg: RewardConfig, *, max_response_tokens: int = 0, patch_size: int = 0,
                 model: WorkerGroup | None = None, judge: WorkerGroup | None = None) -> None:
        self.weights = dict(cfg.weights) if cfg.weights else ({} if cfg.function == "none" else {cfg.function: 1.0})
        self.verifiers, self.default_verifier = dict(cfg.verifiers), cfg.verifier
        self.manager = RewardManager([*self.weights, cfg.verifier, *cfg.verifiers.values()], timeout_s=cfg.timeout_s,
                                     num_workers=cfg.num_workers, max_memory_mb=cfg.max_memory_mb,
                                     max_abs_score=cfg.max_abs_score, isolation=cfg.isolation)
        self.model_weight, self.judge_weight = cfg.model.weight, cfg.judge.weight
        self.model, self.judge = model, judge
        self.max_failed_steps, self.failed_steps = cfg.max_failed_steps, 0
        self.max_response_tokens, self.patch_size = max_response_tokens, patch_size

    def launch(self) -> None:
        """Start the reward worker processes without waiting for them (they load while the caller goes on)."""
        self.manager.launch()

    def connect(self, model: WorkerGroup | None = None, judge: WorkerGroup | None = None) -> None:
        """Score with these reward-model and judge groups from now on (None: that part is not configured)."""
        self.model, self.judge = model, judge

    def score(self, batch: Batch) -> RewardScores:
        """The training reward, the verdicts and the metrics of a batch of samples."""
        if not self.weights and self.model is None and self.judge is None:
            raise ValueError("the reward has no part: set reward.function, reward.model.path or reward.judge.path")
        count, verifier_of = len(batch), self._verifiers_of(batch)
        results = self._run(batch, verifier_of, {spec: range(count) for spec in self.weights})
        metrics = {key: value for name, result in results.items() if result.asked
                   for key, value in result.metrics(name).items()}
        parts = []
        if self.weights:
            parts.append((1.0, self._rules(results, count, metrics)))
        if self.model is not None:
            model_scores = self.model.compute_rm_scores(batch)["rm_scores"].float()
            parts.append((self.model_weight, model_scores))
            metrics |= {"reward/model/score": float(model_scores.mean()),
                        "reward/model/std": float(model_scores.std(unbiased=False))}
        if self.judge is not None:
            judge_scores, judge_metrics = self._judge(batch)
            parts.append((self.judge_weight, judge_scores))
            metrics |= judge_metrics
        total = weighted_sum(parts, count)
        correct = self._verdicts(results, verifier_of)
        metrics["reward/score/total"] = float(total.mean()) if count else 0.0
        metrics["train/acc"] = float(correct.mean()) if count else 0.0
        return RewardScores(scores=total, correct=correct, metrics=metrics)

    def verify(self, batch: Batch) -> torch.Tensor:
        """(B,) float32 verdicts (1 = correct) of the samples' verifiers; one that fails on a sample scores it 0."""
        verifier_of = self._verifiers_of(batch)
        return self._verdicts(self._run(batch, verifier_of, {}), verifier_of)

    def close(self) -> None:
        """End the reward worker processes."""
        self.manager.close()

    def _verifiers_of(self, batch: Batch) -> list[str]:
        return [self.verifiers.get(source, self.default_verifier) for source in batch["data_source"]]

    def _run(self, batch: Batch, verifier_of: list[str], asked: dict[str, Sequence[int]]) -> dict[str, FunctionResult]:
        """Every function once on the samples it is asked for: ``asked`` (the rules: all), plus each
        sample for its verifier."""
        samples = {spec: set(asked.get(spec, ())) for spec in self.manager.names}
        for index, spec in enumerate(verifier_of):
            samples[spec].add(index)
        inputs = reward_inputs(batch, self.max_response_tokens, self.patch_size)
        return self.manager.score(inputs, {spec: sorted(indices) for spec, indices in samples.items()})

    def _verdicts(self, results: dict[str, FunctionResult], verifier_of: list[str]) -> torch.Tensor:
        return torch.tensor([results[self.manager.names[spec]].scores[i] for i, spec in enumerate(verifier_of)],
                            dtype=torch.float32)

    def _rules(self, results: dict[str, FunctionResult], count: int, metrics: dict[str, float]) -> torch.Tensor:
        """(B,) the rules' weighted sum; adds its metrics and counts the step towards ``max_failed_steps``."""
        rules = [results[self.manager.names[spec]] for spec in self.weights]
        scores = weighted_sum([(w, torch.tensor(r.scores)) for w, r in zip(self.weights.values(), rules)], count)
        failed = [any(r.failed[i] for r in rules) for i in range(count)]
        metrics["reward/score/mean"] = float(scores.mean()) if count else 0.0
        metrics["reward/failed_samples"] = float(sum(failed))
        self.failed_steps = self.failed_steps + 1 if failed and all(failed) else 0
        if self.failed_steps >= self.max_failed_steps:
            errors = [e for r in rules for e in r.errors][:3]
            raise RewardFailure(
                f"every sample of the last {self.failed_steps} steps had a failed reward call "
                f"(reward.max_failed_steps={self.max_failed_steps}); first errors: {errors}. Fix the "
                "reward function (run it on a few rows by hand), or raise reward.timeout_s / reward.max_memory_mb"
            )
        return scores

    def _judge(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """The judge's verdicts (``JudgeWorker.judge``): 1 yes, 0 no or unparsable."""
        out = self.judge.judge(batch)  # type: ignore[union-attr]
        scores, parsed = out["judge_scores"].float(), out["judge_parsed"]
        unparsable = int((parsed == 0).sum())
        if unparsable:
            log.warning("the judge gave no yes/no verdict on %d of %d samples (scored 0), e.g. %r",
                        unparsable, len(parsed), out["judge_text"][int((parsed == 0).nonzero()[0])])
        return scores, {"reward/judge/score": float(scores.mean()), "reward/judge/unparsable": float(unparsable)}


def model_image_size(grid_thw: Sequence[int] | torch.Tensor, patch_size: int) -> tuple[int, int]:
    """(width, height) in pixels of an image the processor resized to a (t, h, w) patch grid."""
    return int(grid_thw[2]) * patch_size, int(grid_thw[1]) * patch_size


def reward_inputs(batch: Batch, max_response_tokens: int = 0, patch_size: int = 0) -> list[RewardInput]:
    """One RewardInput per sample; a prompt's images and video frames are decoded once for its n samples.

    ``patch_size`` (the vision tower's, in pixels) gives each image's size as the model saw it
    (``model_image_sizes``) from the sample's ``image_grids`` ((t, h, w) per image of its prompt), else
    its encoded ``prompt``'s ``image_grid_thw``; 0 leaves them unknown.
    """
    batch.require("response_text", "answer", "data_source", "images", "extra")
    count = len(batch)
    videos = batch["videos"] if "videos" in batch.objects else [[]] * count
    messages = batch["messages"] if "messages" in batch.objects else [[]] * count
    if "image_grids" in batch.objects:
        grids = batch["image_grids"]
    else:
        grids = [getattr(p, "image_grid_thw", None) for p in batch["prompt"]] if "prompt" in batch.objects else [None] * count
    lengths = batch["response_mask"].sum(-1).long().tolist() if "response_mask" in batch.tensors else [0] * count
    episodes = batch["episode"] if "episode" in batch.objects else [None] * count
    decoded: dict[int, list[Image.Image]] = {}
    clips: dict[int, list[Video]] = {}
    inputs = []
    for i in range(count):
        images, stored = batch["images"][i], videos[i]
        if id(images) not in decoded:
            decoded[id(images)] = [decode_image(b) for b in images]
        if id(stored) not in clips:
            clips[id(stored)] = [decode_video(v) for v in stored]
        sizes = [model_image_size(g, patch_size) for g in grids[i]] if grids[i] is not None and patch_size else []
        inputs.append(RewardInput(
            response=batch["response_text"][i], ground_truth=batch["answer"][i], data_source=batch["data_source"][i],
            images=decoded[id(images)], videos=clips[id(stored)], extra=batch["extra"][i],
            prompt=prompt_text(messages[i]), model_image_sizes=sizes, response_tokens=int(lengths[i]),
            max_response_tokens=max_response_tokens, episode=readable_episode(episodes[i]),
        ))
    return inputs


def readable_episode(record: dict | None) -> dict:
    """An agent episode's record (:func:`mmrl.agent.rollout.episode_record`) with its tools' images decoded
    (PIL); {} for a single-turn sample."""
    if not record:
        return {}
    calls = [{**call, "images": [decode_image(b) for b in call["images"]]} for call in record["calls"]]
    return {**record, "calls": calls}
