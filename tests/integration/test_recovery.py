"""A worker killed in the middle of a run: the driver notices, rebuilds the workers from the newest
checkpoint, finishes the run, and ends where a clean resume from that checkpoint ends."""

import copy
import signal
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from mmrl.trainer.run import run_rl

LENGTH_REWARD = "def score(response):\n    return len(response) / 10\n"


def short_run(cfg, out_dir: Path, steps: int):
    cfg = copy.deepcopy(cfg)
    plugin = out_dir.parent / "length_reward.py"
    plugin.write_text(LENGTH_REWARD)
    cfg.reward.function, cfg.reward.weights = f"{plugin}:score", {}
    cfg.trainer.out_dir, cfg.trainer.steps = str(out_dir), steps
    cfg.trainer.save_every, cfg.trainer.keep_last, cfg.trainer.eval_every = 3, 10, 100
    return cfg


def restart_step(run_id: str, uri: str) -> tuple[int, float]:
    """(the step the restart resumed at, when it was logged) from the run's trainer/restarts metric."""
    (point,) = MlflowClient(uri).get_metric_history(run_id, "trainer/restarts")
    assert point.value == 1.0
    return point.step, point.timestamp / 1000


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sigkill_of_a_worker_mid_run_is_recovered_exactly(tiny_config, tmp_path, run_with_a_kill):
    cfg = short_run(tiny_config, tmp_path / "killed", 9)
    kill = run_with_a_kill(cfg, after_step=3, rank=0)
    assert kill.trainer.restarts == 1 and kill.trainer.step_no == 9
    step, logged_at = restart_step(kill.run_id, cfg.tracking.uri)
    print(f"kill test: pid {kill.pid} killed; restart logged {logged_at - kill.killed_at:.1f} s later, "
          f"resuming at step {step}")
    resumed_from = tmp_path / "killed" / f"step_{step - 1}"
    assert step - 1 in (3, 6) and resumed_from.is_dir()

    clean = short_run(tiny_config, tmp_path / "clean", 9)
    clean.trainer.resume = str(resumed_from)
    run_rl(clean)
    assert same_weights(tmp_path / "killed" / "checkpoint", tmp_path / "clean" / "checkpoint")


def test_a_worker_that_hangs_past_the_step_timeout_is_treated_as_dead(tiny_config, tmp_path, run_with_a_kill):
    """SIGSTOP freezes a rank (as a stuck process would be): its call passes trainer.step_timeout_s, the
    driver gives up on it, rebuilds the workers and finishes the run."""
    cfg = short_run(tiny_config, tmp_path / "hung", 5)
    cfg.trainer.step_timeout_s = 8.0
    hang = run_with_a_kill(cfg, after_step=3, rank=0, sig=signal.SIGSTOP)
    assert hang.trainer.restarts == 1 and hang.trainer.step_no == 5
    step, logged_at = restart_step(hang.run_id, cfg.tracking.uri)
    assert 8.0 <= logged_at - hang.killed_at < 120
    assert (tmp_path / "hung" / "checkpoint" / "model.safetensors").is_file()


def test_max_restarts_bounds_the_retries(tiny_config, tmp_path, run_with_a_kill):
    cfg = short_run(tiny_config, tmp_path / "fragile", 5)
    cfg.trainer.max_restarts = 0
    with pytest.raises(RuntimeError, match=r"a worker failed again after 0 restarts \(trainer.max_restarts=0\)"):
        run_with_a_kill(cfg, after_step=3, rank=0)
