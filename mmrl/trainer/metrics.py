"""The driver's per-step metrics, computed from a step's Batch (names as in docs/architecture.md)."""

from __future__ import annotations

import torch

from mmrl.controller import WorkerGroup
from mmrl.memory.peaks import PEAK_KEY
from mmrl.protocol import Batch
from mmrl.trajectory import policy_mask


def step_metrics(batch: Batch) -> dict[str, float]:
    """Score, advantage (over the policy's tokens) and length statistics, and the rollout/trainer agreement.

    batch: token_level_rewards, advantages, response_mask, entropy, rollout_log_probs, old_log_probs, each
    (B, R), and policy_mask when the responses have holes (:mod:`mmrl.trajectory`). The lengths are the
    extent's (``response_length/*``) and the policy's tokens' (``response_length/policy_tokens``); every
    per-token statistic is over the policy's tokens.
    """
    lengths = batch["response_mask"].sum(-1)
    mask = policy_mask(batch)
    scores = batch["token_level_rewards"].sum(-1)
    adv = batch["advantages"][mask.bool()]
    # Absent when an on-policy step took its old log-probs inside the update (or from the rollout): the entropy
    # is the log-prob pass's, of the policy before the update (the update computes one only for its bonus).
    trainer_side = {}
    if "entropy" in batch.tensors:
        trainer_side["actor/entropy"] = float((batch["entropy"] * mask).sum() / mask.sum())
    if "old_log_probs" in batch.tensors and "rollout_log_probs" in batch.tensors:
        diff = (batch["rollout_log_probs"] - batch["old_log_probs"]).abs() * mask
        trainer_side["rollout/logprob_diff_max"] = float(diff.max())
    return trainer_side | group_metrics(batch, scores) | {
        "critic/score/mean": float(scores.mean()),
        "critic/score/max": float(scores.max()),
        "critic/score/min": float(scores.min()),
        "critic/advantages/mean": float(adv.mean()),
        "critic/advantages/max": float(adv.max()),
        "critic/advantages/min": float(adv.min()),
        "response_length/mean": float(lengths.float().mean()),
        "response_length/max": float(lengths.max()),
        "response_length/clip_ratio": float((lengths >= mask.shape[1]).float().mean()),
        "response_length/policy_tokens": float(mask.sum(-1).float().mean()),
    }


def group_metrics(batch: Batch, scores: torch.Tensor) -> dict[str, float]:
    """The advantage signal of group baselines: the share of groups (samples sharing a ``uid``) whose scores all
    agree (they teach nothing), and among those by verified correctness, all right or all wrong."""
    if "uid" not in batch.objects:
        return {}
    groups: dict[str, list[int]] = {}
    for row, uid in enumerate(batch["uid"]):
        groups.setdefault(uid, []).append(row)
    flat = [rows for rows in groups.values() if float(scores[rows].max() - scores[rows].min()) <= 1e-9]
    out = {"critic/flat_groups": len(flat) / len(groups)}
    if "correct" in batch.tensors:
        correct = batch["correct"]
        out["critic/flat_groups_all_right"] = sum(bool(correct[rows].all()) for rows in flat) / len(groups)
        out["critic/flat_groups_all_wrong"] = sum(not bool(correct[rows].any()) for rows in flat) / len(groups)
    return out


def value_metrics(batch: Batch) -> dict[str, float]:
    """Value and return statistics over the policy's tokens, and the explained variance of the returns by the
    values; empty without a critic. batch: values, returns, response_mask (and policy_mask), each (B, R)."""
    if "values" not in batch.tensors:
        return {}
    mask = policy_mask(batch).bool()
    values, returns = batch["values"][mask], batch["returns"][mask]
    var = returns.var(unbiased=False)
    explained = 1 - (returns - values).var(unbiased=False) / var if var > 0 else torch.tensor(float("nan"))
    return {
        "critic/values/mean": float(values.mean()),
        "critic/returns/mean": float(returns.mean()),
        "critic/vf_explained_var": float(explained),
    }


def timing_metrics(batch: Batch, timing: dict[str, float], world_size: int) -> dict[str, float]:
    """``timing_s/<stage>`` and the step's token throughput per worker."""
    tokens = float(batch["response_mask"].sum() + batch["prompt_tokens"].sum())
    metrics = {f"timing_s/{k}": v for k, v in timing.items()}
    metrics["perf/throughput"] = tokens / timing["step"] / world_size
    metrics["perf/total_num_tokens"] = tokens
    return metrics


def non_finite(batch: Batch, keys: tuple[str, ...]) -> list[str]:
    """The tensors of ``keys`` that hold a NaN or an infinity on a policy token (the only tokens read)."""
    mask = policy_mask(batch).bool()
    return [k for k in keys if k in batch.tensors and not torch.isfinite(batch[k][mask]).all()]


def memory_metrics(metrics: dict[str, float], groups: dict[str, WorkerGroup]) -> dict[str, float]:
    """``perf/max_memory_gb/<group>`` (the largest peak of the group's ranks in this step: actor, critic,
    reward_model, judge) and ``perf/max_memory_gb`` (the largest of them). A group's update reports its own in
    ``metrics`` (its peak up to the update's end); the other groups are asked at the step's end."""
    peaks = {}
    for name, group in groups.items():
        key = f"{PEAK_KEY}/{name}"
        peaks[key] = metrics[key] if key in metrics else max(group.peak_memory_gb())
    return peaks | {PEAK_KEY: max(peaks.values())}
