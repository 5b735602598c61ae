"""The learning-rate schedule of the actor and the critic: warm-up, then constant or a cosine decay."""

import math

import pytest
import torch

from mmrl.run_config import load_run_config
from mmrl.workers.update import build_optimizer, lr_factor


def test_lr_factor_by_hand():
    assert [lr_factor(s, 4, 0, 0.0) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    # cosine from step 2 (end of warm-up) to step 10: halfway (step 6) is (1 + min) / 2
    assert lr_factor(6, 2, 10, 0.1) == pytest.approx(0.55)
    assert lr_factor(10, 2, 10, 0.1) == pytest.approx(0.1) and lr_factor(50, 2, 10, 0.1) == pytest.approx(0.1)
    expected = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 8))
    assert lr_factor(5, 2, 10, 0.1) == pytest.approx(expected)


def test_the_optimizer_follows_the_schedule_and_the_config_spans_the_run():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer, scheduler = build_optimizer([param], 1.0, 0.0, 1, decay_steps=4, min_lr_ratio=0.0)
    seen = []
    for _ in range(5):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # warm-up step 0; the cosine runs from step 1 (1.0) over thirds: 0.75, 0.25, then 0
    assert seen == pytest.approx([1.0, 1.0, 0.75, 0.25, 0.0])
    cfg = load_run_config(None, ["trainer.steps=50", "actor.num_mini_batches=2", "actor.ppo_epochs=3"])
    assert cfg.actor.decay_steps == 300
