"""Each of the newer losses (CISPO, SAPO, GMPO, GPG, Clip-Cov, KL-Cov, DPPO) runs two GRPO steps end to end (real
Ray workers, MLflow; three in make test, the others in make test-extra), with its own metric logged, finite,
and a gradient that moved the policy; off-policy guidance and the pass-rate rules run two steps. (The estimators,
grpo_pass_k and opo, run end to end from their configs in tests/integration/test_algorithm_family.py.)"""

import dataclasses
import math

import pytest
from mlflow.tracking import MlflowClient

from mmrl.models.loading import load_processor
from mmrl.trainer.tracking import Tracker
from mmrl.trainer.checkpoint import load_driver_state
from mmrl.trainer.rl import RLTrainer
from mmrl.trainer.run import run_rl

# (overrides, the metric the loss logs). Each loss is a pure function of the same inputs through the loss table
# (their math: tests/unit); make test runs three that differ in what reaches them (a loss of its own metric, one
# with its own aggregation, one with its own section), `make test-extra` the others.
extra = pytest.mark.extra
RUNS = [
    pytest.param({"actor.loss.policy": "cispo"}, "actor/pg_clipfrac", marks=extra),
    ({"actor.loss.policy": "sapo"}, "actor/sapo_gate"),
    ({"actor.loss.policy": "gmpo", "actor.loss_agg_mode": "seq-mean-token-mean"}, "actor/pg_clipfrac"),
    pytest.param({"actor.loss.policy": "gpg"}, "actor/ppo_kl", marks=extra),
    pytest.param({"actor.loss.policy": "clip_cov", "actor.loss.clip_cov.lb": 0.0}, "actor/pg_clipfrac", marks=extra),
    ({"actor.loss.policy": "kl_cov", "actor.loss.kl_cov.ratio": 0.2}, "actor/kl_cov_frac"),
    pytest.param({"actor.loss.policy": "dppo_tv"}, "actor/pg_clipfrac", marks=extra),
    pytest.param({"actor.loss.policy": "dppo_kl"}, "actor/pg_clipfrac", marks=extra),
]


class Recording(RLTrainer):
    """Keeps each step's trained batch (its advantages included)."""

    def update(self, batch):
        self.batches = [*getattr(self, "batches", []), batch]
        return super().update(batch)


@pytest.mark.parametrize(("overrides", "metric"), RUNS)
def test_each_new_loss_runs_two_rl_steps(overrides, metric, tiny_config, tmp_path):
    varied = tmp_path / "varied.py"  # a reward that tells a random model's samples apart, so no group is flat
    varied.write_text("def by_length(response):\n    return float(len(response) % 5 == 0)\n")
    cfg = dataclasses.replace(tiny_config, given_keys=frozenset(overrides))
    cfg.reward.function, cfg.reward.isolation = f"{varied}:by_length", "inline"
    cfg.trainer.steps, cfg.trainer.eval_every, cfg.trainer.val_size = 2, 0, 4
    cfg.trainer.prompts_per_step, cfg.rollout.n, cfg.rollout.max_new_tokens = 2, 4, 4
    for key, value in overrides.items():
        *sections, name = key.split(".")
        node = cfg
        for section in sections:
            node = getattr(node, section)
        setattr(node, name, value)
    client = MlflowClient(cfg.tracking.uri)
    run = client.get_run(run_rl(cfg)["mlflow_run_id"])
    assert [p.step for p in client.get_metric_history(run.info.run_id, "actor/pg_loss")] == [1, 2]
    assert math.isfinite(run.data.metrics["actor/pg_loss"]) and metric in run.data.metrics
    norms = [p.value for p in client.get_metric_history(run.info.run_id, "actor/grad_norm")]
    assert max(norms) > 0  # some step had a gradient: the loss reached the weights


def test_guidance_gives_each_all_wrong_group_one_right_sample_and_the_pass_rates_only_the_policy_s(tiny_config,
                                                                                                    tmp_path):
    """GRPO with trainer.guide_unsolved and the revisit rule, two steps: the random policy is always wrong, so
    every group trains on its own samples plus one guide (its answer in the trained format), the guide's
    advantage positive and the others' negative; train/acc and the checkpoint's pass rates count only the
    policy's samples."""
    cfg = tiny_config
    cfg.trainer.steps, cfg.trainer.eval_every, cfg.trainer.val_size = 2, 0, 4
    cfg.trainer.guide_unsolved, cfg.trainer.unsolved_revisit_rate = True, 0.5
    cfg.trainer.prompts_per_step, cfg.rollout.n = 2, 3
    cfg.rollout.max_new_tokens = 8  # room for "<answer>colour</answer>" (7 tiny-tokenizer tokens) and the end token
    trainer = Recording(cfg)
    tracker = Tracker(cfg, cfg.trainer.experiment, "guidance", stage="rl")
    try:
        trainer.fit(tracker)
        tracker.finish()
    finally:
        trainer.close()
    tokenizer = load_processor(cfg.model.path).tokenizer
    for batch in trainer.batches:
        groups = {}
        for row, uid in enumerate(batch["uid"]):
            groups.setdefault(uid, []).append(row)
        for uid, rows in groups.items():
            *own, guide = rows
            assert batch["guided"][rows].tolist() == [0.0] * len(own) + [1.0], uid
            ids = batch["responses"][guide][batch["response_mask"][guide].bool()]
            assert tokenizer.decode(ids, skip_special_tokens=True) == f"<answer>{batch['answer'][guide]}</answer>"
            assert batch["correct"][guide] == 1 and not batch["correct"][own].any()
            mask = batch["policy_mask"][rows].bool()
            adv = batch["advantages"][rows]
            assert (adv[-1][mask[-1]] > 0).all() and (adv[:-1][mask[:-1]] < 0).all(), uid
    metrics = MlflowClient(cfg.tracking.uri).get_run(tracker.run_id).data.metrics
    assert metrics["guide/groups"] == 1.0 and metrics["train/acc"] == 0.0 and metrics["actor/pg_loss"] != 0
    assert "sampler/prompts_never_solved" in metrics
    state = load_driver_state(trainer.last_checkpoint)
    assert state.pass_rates and all(r["correct"] == 0 for r in state.pass_rates.values())
