"""Resumable checkpoints: a run stopped and resumed ends bit-for-bit where an uninterrupted run ends (the adaptive
KL controller's coefficient included)."""

import copy
import json
import os
from pathlib import Path

import pytest
import ray
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from mmrl.controller.reuse import idle_hosts
from mmrl.trainer.checkpoint import load_driver_state
from mmrl.trainer.run import run_rl


LENGTH_REWARD = "def score(response):\n    return len(response) / 10\n"


def configure(cfg, out_dir: Path, steps: int, save_every: int = 2, **overrides):
    """A short run into ``out_dir``; the untrained model never answers right, so a length reward gives the
    updates something to move the weights by."""
    cfg = copy.deepcopy(cfg)
    plugin = out_dir.parent / "length_reward.py"
    plugin.write_text(LENGTH_REWARD)
    cfg.reward.function, cfg.reward.weights = f"{plugin}:score", {}
    cfg.trainer.out_dir = str(out_dir)
    cfg.trainer.steps, cfg.trainer.save_every, cfg.trainer.eval_every = steps, save_every, 100
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    return cfg


def idle_pids() -> list[int]:
    return sorted(ray.get([host.__ray_call__.remote(lambda host: os.getpid()) for host in idle_hosts()]))


def weights(folder: Path, file: str = "model.safetensors") -> dict[str, torch.Tensor]:
    return load_file(str(folder / file))


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


# A KL penalty in the reward with the adaptive controller, moving by up to 10% a step (16 samples a step).
ADAPTIVE_KL = dict(algorithm__use_kl_in_reward=True, algorithm__kl_ctrl="adaptive", algorithm__kl_coef=0.1,
                   algorithm__kl_target=0.01, algorithm__kl_horizon=32)


def adaptive_coefs(cfg, kl: list[float]) -> list[float]:
    """The coefficient each step uses, by hand (Ziegler et al.): ``kl_coef`` first; after a step whose mean KL
    was ``kl[t]`` over ``samples`` samples,
    ``coef *= 1 + clip(kl[t] / kl_target - 1, -0.2, 0.2) * samples / kl_horizon``."""
    algo, samples = cfg.algorithm, cfg.trainer.prompts_per_step * cfg.rollout.n
    coefs = [algo.kl_coef]
    for value in kl[:-1]:
        error = min(max(value / algo.kl_target - 1, -0.2), 0.2)
        coefs.append(coefs[-1] * (1 + error * samples / algo.kl_horizon))
    return coefs


def test_grpo_with_an_adaptive_kl_stopped_after_2_and_resumed_to_4_equals_4_straight(tiny_config, tmp_path):
    cfg = configure(tiny_config, tmp_path / "straight", 4, **ADAPTIVE_KL)
    straight = run_rl(cfg)
    first = run_rl(configure(tiny_config, tmp_path / "resumed", 2, **ADAPTIVE_KL))
    stopped = weights(tmp_path / "resumed" / "checkpoint")
    assert json.loads((tmp_path / "resumed" / "step_2" / "meta.json").read_text())["step"] == 2
    second = run_rl(configure(tiny_config, tmp_path / "resumed", 4, **ADAPTIVE_KL))  # trainer.resume=auto
    assert_identical(weights(tmp_path / "straight" / "checkpoint"), weights(tmp_path / "resumed" / "checkpoint"))
    assert not all(torch.equal(v, stopped[k]) for k, v in weights(tmp_path / "resumed" / "checkpoint").items())

    # The resumed run is the same MLflow run, its metrics continuing at step 3.
    assert second["mlflow_run_id"] == first["mlflow_run_id"] != straight["mlflow_run_id"]
    client = MlflowClient(tiny_config.tracking.uri)
    steps = [m.step for m in client.get_metric_history(second["mlflow_run_id"], "actor/pg_loss")]
    assert sorted(steps) == [1, 2, 3, 4]
    folder = tmp_path / "resumed"
    assert (folder / "latest").read_text() == "step_4"
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("step_")) == ["step_2", "step_4"]

    # The coefficient follows the controller's rule from the logged KL, and step 3 of the resumed run starts from
    # the one saved at step 2, not from kl_coef.
    def history(run: dict, key: str) -> list[float]:
        points = sorted((m.step, m.value) for m in client.get_metric_history(run["mlflow_run_id"], key))
        assert [step for step, _ in points] == [1, 2, 3, 4]
        return [value for _, value in points]

    coefs, kl = history(straight, "actor/reward_kl_coef"), history(straight, "actor/reward_kl")
    assert coefs == pytest.approx(adaptive_coefs(cfg, kl), rel=1e-9)
    assert history(second, "actor/reward_kl_coef") == coefs and history(second, "actor/reward_kl") == kl
    assert load_driver_state(folder / "step_2").kl_coef == pytest.approx(coefs[2], rel=1e-9)
    assert coefs[2] != pytest.approx(cfg.algorithm.kl_coef, rel=1e-3)


def test_ppo_with_a_critic_on_two_fsdp_workers_resumes_bit_for_bit(tiny_config, tmp_path):
    """A 4-step run saves at step 2; a run resumed from that checkpoint (in another folder) ends with the same
    actor and critic weights."""
    base = configure(tiny_config, tmp_path / "base", 4, algorithm__name="ppo", resources__num_workers=2)
    for cfg in (base.actor, base.critic):
        cfg.vision.strategy, cfg.llm.strategy = "fsdp", "fsdp"
    run_rl(configure(base, tmp_path / "straight", 4))
    warm = idle_pids()  # the 4 processes (2 ranks x actor, critic) stay for the next run (resources.reuse_workers)
    resumed = configure(base, tmp_path / "resumed", 4, trainer__resume=str(tmp_path / "straight" / "step_2"))
    run_rl(resumed)
    assert len(warm) == 4 and idle_pids() == warm  # the next run ran in them, and gave them back
    assert (tmp_path / "resumed" / "step_4" / "meta.json").is_file() and not (tmp_path / "resumed" / "step_2").exists()
    assert_identical(weights(tmp_path / "straight" / "checkpoint"), weights(tmp_path / "resumed" / "checkpoint"))
    critic = "value_model.safetensors"
    assert_identical(weights(tmp_path / "straight" / "critic", critic), weights(tmp_path / "resumed" / "critic", critic))


def test_a_run_that_reaches_stop_val_acc_stops_checkpointed_and_a_resume_trains_no_further(tiny_config, tmp_path):
    """trainer.stop_val_acc: with a verifier that calls every answer right, the first evaluation (step 2 of 4) stops
    the run; it is checkpointed and exported there, and a resume (trainer.resume=auto) leaves it as it is, unless
    its config would no longer stop it there (the threshold off: it trains on)."""
    out = tmp_path / "run"
    cfg = configure(tiny_config, out, 4, save_every=0, trainer__eval_every=2, trainer__stop_val_acc=0.75)
    verifier = tmp_path / "always_right.py"
    verifier.write_text("def correct(response):\n    return 1.0\n")
    cfg.reward.verifier = f"{verifier}:correct"
    first = run_rl(cfg)
    assert first["steps"] == 2 and first["val/acc"] == 1.0
    assert (out / "latest").read_text() == "step_2" and load_driver_state(out / "step_2").stopped_at == 1.0
    exported = weights(out / "checkpoint")
    client = MlflowClient(tiny_config.tracking.uri)
    assert [(m.step, m.value) for m in client.get_metric_history(first["mlflow_run_id"], "trainer/stopped_early")] \
        == [(2, 1.0)]

    second = run_rl(cfg)
    assert second["steps"] == 2 and second["mlflow_run_id"] == first["mlflow_run_id"]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("step_")) == ["step_2"]
    assert_identical(exported, weights(out / "checkpoint"))
    assert sorted(m.step for m in client.get_metric_history(first["mlflow_run_id"], "actor/pg_loss")) == [1, 2]

    cfg.trainer.stop_val_acc = 0.0
    third = run_rl(cfg)
    assert third["steps"] == 4 and (out / "latest").read_text() == "step_4"
    assert sorted(m.step for m in client.get_metric_history(first["mlflow_run_id"], "actor/pg_loss")) == [1, 2, 3, 4]


def test_a_checkpoint_loads_into_another_world_size_and_layout(tiny_config, tmp_path):
    """Saved by 2 FSDP ranks, loaded by 1 replicated rank: the same weights, and training goes on."""
    sharded = configure(tiny_config, tmp_path / "two", 2, resources__num_workers=2)
    sharded.actor.vision.strategy, sharded.actor.llm.strategy = "fsdp", "fsdp"
    run_rl(sharded)
    single = configure(tiny_config, tmp_path / "one", 2, trainer__resume=str(tmp_path / "two" / "step_2"))
    run_rl(single)  # nothing left to train: the export holds the loaded weights
    assert_identical(weights(tmp_path / "two" / "checkpoint"), weights(tmp_path / "one" / "checkpoint"))
    single.trainer.steps = 3
    single.trainer.resume = "auto"
    run_rl(single)
    assert (tmp_path / "one" / "step_3" / "meta.json").is_file()


def test_resume_refuses_a_folder_that_is_not_a_checkpoint(tiny_config, tmp_path):
    cfg = configure(tiny_config, tmp_path / "x", 2, trainer__resume=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="is not a complete checkpoint folder"):
        run_rl(cfg)
