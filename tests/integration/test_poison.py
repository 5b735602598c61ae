"""A reward that turns the advantages non-finite: the update is skipped and counted, the weights stay
clean, and too many skipped steps in a row stop the run with a clear error."""

import copy
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from mmrl.trainer.run import run_rl

# Finite and within float32 (and reward.max_abs_score is raised past it), so the reward manager accepts it;
# GAE's whitening then overflows to NaN. What is under test is the trainer's own guard.
HUGE_REWARD = "def score(response):\n    return 3.0e38\n"


def poisoned_ppo(cfg, tmp_path: Path, steps: int, max_skipped: int):
    cfg = copy.deepcopy(cfg)
    plugin = tmp_path / "huge_reward.py"
    plugin.write_text(HUGE_REWARD)
    cfg.reward.function, cfg.reward.weights = f"{plugin}:score", {}
    cfg.reward.max_abs_score = 3.4e38
    cfg.algorithm.name = "ppo"
    cfg.trainer.out_dir, cfg.trainer.steps, cfg.trainer.eval_every = str(tmp_path / "rl"), steps, 100
    cfg.trainer.max_skipped_steps = max_skipped
    return cfg


def test_skipped_steps_leave_the_weights_untouched(tiny_config, tmp_path):
    cfg = poisoned_ppo(tiny_config, tmp_path, steps=3, max_skipped=3)
    result = run_rl(cfg)
    history = MlflowClient(cfg.tracking.uri).get_metric_history(result["mlflow_run_id"], "trainer/skipped_step")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 1.0), (3, 1.0)]
    start = load_file(str(Path(cfg.model.path) / "model.safetensors"))
    end = load_file(str(tmp_path / "rl" / "checkpoint" / "model.safetensors"))
    assert start.keys() == end.keys() and all(torch.equal(start[k], end[k]) for k in start)


def test_too_many_skipped_steps_in_a_row_stop_the_run(tiny_config, tmp_path):
    cfg = poisoned_ppo(tiny_config, tmp_path, steps=5, max_skipped=1)
    with pytest.raises(RuntimeError, match=r"step 2: 2 steps in a row skipped their update.*max_skipped_steps=1"):
        run_rl(cfg)
