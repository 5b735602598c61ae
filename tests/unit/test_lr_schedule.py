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


class _Metrics:
    """Keeps what train_steps logs (the sink of an MLflow Tracker)."""

    def __init__(self) -> None:
        self.logged: list[dict[str, float]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append(metrics)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_the_supervised_stages_follow_their_schedule(schedule):
    from mmrl.config import OptimConfig
    from mmrl.trainer.supervised import train_steps

    cfg = OptimConfig(steps=6, batch_size=1, lr=0.5, warmup_steps=2, lr_schedule=schedule, min_lr_ratio=0.2)
    param = torch.nn.Parameter(torch.zeros(1))
    sink = _Metrics()
    train_steps("sft", cfg, [param], 4, 0, lambda indices: ((param - 1.0).pow(2).sum(), {}), sink)

    def by_hand(k: int) -> float:  # the multiplier at optimizer step k (0-based): warm-up over 2, then the schedule
        if k < 2:
            return (k + 1) / 2
        if schedule == "constant":
            return 1.0
        return 0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * min(1.0, (k - 2) / 4)))

    # logged after the scheduler stepped: the lr of the next step
    assert [m["sft/lr"] for m in sink.logged] == pytest.approx([0.5 * by_hand(k + 1) for k in range(6)])
    assert param.item() > 0.5  # and it trained
