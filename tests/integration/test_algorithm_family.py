"""Every algorithm's config (configs/algos/*.yaml) runs end to end: a few steps through real Ray workers on the
tiny model, tracked in MLflow, each with its own pieces visible in the metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mmrl.algos import key_owners
from mmrl.config import load_config
from mmrl.trainer.run import run_rl

CONFIGS = sorted(Path("configs/algos").glob("*.yaml"))
# A reward that differs between the random-init model's responses (its answers are all wrong), so that
# group baselines, win rates and dynamic sampling have something to compare.
VARIED = "tests/fixtures/reward_plugins/kinds.py:text_length_parity"
# DAPO's: flat on half the tasks, so that a step takes several generation rounds (and still one weight sync).
HALF_FLAT = "tests/fixtures/reward_plugins/kinds.py:parity_on_colour"
# What each algorithm must show in its metrics beyond the common ones.
EXPECTED = {
    "dapo": ["filter/gen_rounds", "filter/kept_samples"],
    "vapo": ["critic/vf_loss", "filter/gen_rounds", "actor/positive_lm_loss", "trainer/actor_waits"],
    "pf_ppo": ["critic/vf_loss", "filter/kept_samples"],
    "ppo": ["critic/vf_loss"],
    "reinforce_plus_plus": ["actor/reward_kl", "actor/reward_kl_coef", "timing_s/old_log_prob"],
    "remax": ["timing_s/baseline"],
}


# Algorithms whose run differs from GRPO's only in a pure function (the advantage estimator or the loss's
# aggregation, each unit-tested against a reference): `make test` runs GRPO's path end to end in
# tests/integration/test_rl_pipeline.py, so these end-to-end runs are `make test-extra`'s.
GROUP_BASELINES = {"grpo", "dr_grpo", "grpo_pass_k", "gspo", "opo", "otb", "reinforce_plus_plus_baseline", "rloo"}


def test_there_is_one_config_per_algorithm():
    from mmrl.algos import ALGORITHMS

    assert {path.stem for path in CONFIGS} == set(ALGORITHMS)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_each_algorithm_config_loads_and_checks(path, tiny_config):
    """Every config resolves against the tiny model (the end-to-end runs below that `make test` leaves to
    `make test-extra` still have their configs checked)."""
    cfg = load_config(path, [f"model.path={tiny_config.model.path}", f"trainer.init={tiny_config.model.path}",
                             f"data.dir={tiny_config.data.dir}"])
    cfg.check()
    assert cfg.algorithm.name == path.stem


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.extra) if p.stem in GROUP_BASELINES else p
                                  for p in CONFIGS], ids=[p.stem for p in CONFIGS])
def test_each_algorithm_config_runs_end_to_end(path, tiny_config, tmp_path):
    owned = [key for key in ("algorithm.pf_ppo.filter_k=2", "algorithm.max_gen_rounds=8")
             if path.stem in key_owners()[key.split("=")[0]]]  # each algorithm is given only its own keys
    cfg = load_config(path, ["model.compile=false", 
        f"model.path={tiny_config.model.path}", f"trainer.init={tiny_config.model.path}",
        f"data.dir={tiny_config.data.dir}", f"trainer.out_dir={tmp_path / 'rl'}",
        f"tracking.uri={tiny_config.tracking.uri}", f"tracking.artifact_dir={tiny_config.tracking.artifact_dir}",
        "trainer.steps=2", "trainer.prompts_per_step=4", "trainer.val_size=4", "trainer.eval_every=0",
        "rollout.n=4", "rollout.max_new_tokens=8", "resources.threads_per_worker=1",
        "resources.reuse_workers=true", "tracking.mfu=false", "tracking.log_model=false",
        "tracking.system_metrics=false", *owned,
    ])
    if cfg.algorithm.critic_warmup_steps:
        cfg.algorithm.critic_warmup_steps = 1  # step 1 trains the critic alone, step 2 both
    cfg.reward.weights, cfg.reward.function = {}, HALF_FLAT if path.stem == "dapo" else VARIED
    cfg.check()
    result = run_rl(cfg)
    client = MlflowClient(cfg.tracking.uri)
    run = client.get_run(result["mlflow_run_id"])
    history = {key: [m.value for m in client.get_metric_history(run.info.run_id, key)]
               for key in ("rollout/weight_syncs", "filter/gen_rounds", "trainer/actor_waits")}
    # The weights reach the engine once a step the actor trained (a critic warm-up step moves no weights),
    # whatever extra rollouts (ReMax) or rounds (DAPO) the step takes.
    expected = [0.0, 1.0] if history["trainer/actor_waits"] else [1.0, 1.0]  # the warm-up is step 1 alone
    assert history["rollout/weight_syncs"] == expected, (path.stem, history)
    if path.stem == "dapo":
        assert max(history["filter/gen_rounds"]) >= 2, history
    assert run.info.status == "FINISHED" and run.data.params["algorithm.name"] == path.stem
    assert "perf/peak_tflops" not in run.data.metrics  # tracking.mfu=false (the suite's): no peak measured
    for key in ["critic/score/mean", "actor/pg_loss", "actor/grad_norm", "val/acc",
                *EXPECTED.get(path.stem, [])]:
        assert key in run.data.metrics, (path.stem, key)
    assert (Path(cfg.trainer.out_dir) / "checkpoint" / "config.json").is_file()


def test_dynamic_sampling_stops_with_a_clear_error_when_no_group_differs(tiny_config, tmp_path):
    """A reward that never differs within a group: DAPO generates max_gen_rounds rounds, then stops and says
    what to change (nothing is trained on zero-advantage groups)."""
    cfg = load_config("configs/algos/dapo.yaml", ["model.compile=false", 
        f"model.path={tiny_config.model.path}", f"trainer.init={tiny_config.model.path}",
        f"data.dir={tiny_config.data.dir}", f"trainer.out_dir={tmp_path / 'rl'}",
        f"tracking.uri={tiny_config.tracking.uri}", f"tracking.artifact_dir={tiny_config.tracking.artifact_dir}",
        "trainer.steps=1", "trainer.prompts_per_step=2", "trainer.val_size=2", "rollout.n=2",
        "rollout.max_new_tokens=4", "algorithm.max_gen_rounds=2", "resources.threads_per_worker=1",
        "resources.reuse_workers=true",
    ])
    cfg.reward.weights, cfg.reward.function = {}, "tests/fixtures/reward_plugins/kinds.py:constant"
    cfg.check()
    with pytest.raises(RuntimeError, match=r"dynamic sampling: after 2 generation rounds only 0 of 2 prompts .* "
                                           r"raise algorithm.max_gen_rounds"):
        run_rl(cfg)
