"""The driver's per-step metrics, against loops over the valid tokens."""

import pytest
import torch

from mmrl.protocol import Batch
from mmrl.trainer.metrics import step_metrics


def test_step_metrics_read_every_valid_token_and_no_padding():
    torch.manual_seed(0)
    lengths = [3, 1, 4]
    mask = torch.tensor([[1.0] * n + [0.0] * (4 - n) for n in lengths])
    # GAE-like per-token advantages; huge values on padding must not leak into the statistics.
    advantages = torch.where(mask.bool(), torch.randn(3, 4), torch.full((3, 4), 1e6))
    rewards = torch.zeros(3, 4)
    rewards[0, 2], rewards[1, 0], rewards[2, 3] = 1.0, 0.0, 0.5
    batch = Batch(tensors={
        "response_mask": mask, "advantages": advantages, "token_level_rewards": rewards,
        "entropy": torch.rand(3, 4), "rollout_log_probs": torch.zeros(3, 4), "old_log_probs": torch.full((3, 4), -0.1),
    })
    metrics = step_metrics(batch)
    valid = [float(advantages[i, t]) for i, n in enumerate(lengths) for t in range(n)]
    assert metrics["critic/advantages/mean"] == pytest.approx(sum(valid) / len(valid))
    assert metrics["critic/advantages/max"] == pytest.approx(max(valid))
    assert metrics["critic/advantages/min"] == pytest.approx(min(valid))
    assert len(valid) == 8 and abs(sum(valid) / 8 - float(advantages[:, 0].mean())) > 0.1  # token 0 alone differs
    assert metrics["critic/score/mean"] == pytest.approx(0.5)
    assert metrics["response_length/mean"] == pytest.approx(8 / 3)
    assert metrics["response_length/clip_ratio"] == pytest.approx(1 / 3)
    entropy = [float(batch["entropy"][i, t]) for i, n in enumerate(lengths) for t in range(n)]
    assert metrics["actor/entropy"] == pytest.approx(sum(entropy) / 8)
    assert metrics["rollout/logprob_diff_max"] == pytest.approx(0.1)


def test_flat_groups_count_the_groups_whose_scores_agree():
    """Groups a (1, 1: flat, all right), b (0, 1: mixed), c (0, 0, 0: flat, all wrong), d (alone: flat, right)."""
    uids = ["a", "a", "b", "b", "c", "c", "c", "d"]
    scores = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    mask = torch.ones(len(uids), 2)
    rewards = torch.zeros(len(uids), 2)
    rewards[:, 1] = torch.tensor(scores)
    batch = Batch(tensors={"response_mask": mask, "advantages": torch.zeros(len(uids), 2),
                           "token_level_rewards": rewards, "correct": torch.tensor(scores)},
                  objects={"uid": uids})
    metrics = step_metrics(batch)
    assert metrics["critic/flat_groups"] == pytest.approx(3 / 4)
    assert metrics["critic/flat_groups_all_right"] == pytest.approx(2 / 4)
    assert metrics["critic/flat_groups_all_wrong"] == pytest.approx(1 / 4)
