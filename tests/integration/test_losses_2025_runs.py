"""Each 2025-26 loss runs two GRPO steps end to end (real Ray workers, MLflow), with its own metric logged, finite,
and a gradient that moved the policy. (The estimators, grpo_pass_k and opo, run end to end from their configs in
tests/integration/test_algorithm_family.py.)"""

import copy
import dataclasses
import math

import pytest
from mlflow.tracking import MlflowClient

from mmrl.trainer.rl import run_rl

RUNS = [  # (overrides, the metric the loss logs)
    ({"actor.policy_loss": "cispo"}, "actor/pg_clipfrac"),
    ({"actor.policy_loss": "sapo"}, "actor/sapo_gate"),
    ({"actor.policy_loss": "gmpo", "actor.loss_agg_mode": "seq-mean-token-mean"}, "actor/pg_clipfrac"),
    ({"actor.policy_loss": "gpg"}, "actor/ppo_kl"),
    ({"actor.policy_loss": "clip_cov", "actor.clip_cov_lb": 0.0}, "actor/pg_clipfrac"),
    ({"actor.policy_loss": "kl_cov", "actor.kl_cov_ratio": 0.2}, "actor/kl_cov_frac"),
    ({"actor.policy_loss": "dppo_tv"}, "actor/pg_clipfrac"),
    ({"actor.policy_loss": "dppo_kl"}, "actor/pg_clipfrac"),
]


@pytest.mark.extra  # the losses' code is the unit-tested functions, through the updater every run takes: make test-extra
def test_each_new_loss_runs_two_rl_steps(tiny_config, tmp_path):
    cfg = tiny_config
    varied = tmp_path / "varied.py"  # a reward that tells a random model's samples apart, so no group is flat
    varied.write_text("def by_length(response):\n    return float(len(response) % 5 == 0)\n")
    cfg.reward.function, cfg.reward.isolation = f"{varied}:by_length", "inline"
    cfg.trainer.steps, cfg.trainer.eval_every, cfg.trainer.val_size = 2, 0, 4
    cfg.trainer.prompts_per_step, cfg.rollout.n, cfg.rollout.max_new_tokens = 2, 4, 4
    client = MlflowClient(cfg.tracking.uri)
    for overrides, metric in RUNS:
        run_cfg = dataclasses.replace(copy.deepcopy(cfg), given_keys=frozenset(overrides))
        for key, value in overrides.items():
            section, name = key.split(".")
            setattr(getattr(run_cfg, section), name, value)
        run_cfg.trainer.out_dir = str(tmp_path / "_".join(str(v) for v in overrides.values()))
        result = run_rl(run_cfg)
        run = client.get_run(result["mlflow_run_id"])
        label = f"{overrides}"
        assert [p.step for p in client.get_metric_history(run.info.run_id, "actor/pg_loss")] == [1, 2], label
        assert math.isfinite(run.data.metrics["actor/pg_loss"]) and metric in run.data.metrics, label
        norms = [p.value for p in client.get_metric_history(run.info.run_id, "actor/grad_norm")]
        assert max(norms) > 0, label  # some step had a gradient: the loss reached the weights
