"""The async mode on real Ray pools: with max_staleness=0 it trains on exactly what the sync mode does, and with a
slow rollout rank no sample older than max_staleness is trained on."""

import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from mmrl.run_config import prepare_run_config
from mmrl.tracking import Tracker
from mmrl.trainer.async_rl import AsyncRLTrainer
from mmrl.trainer.rl import RLTrainer
from pipelines.probes import SlowRollout


def recording(base: type) -> type:
    """``base`` keeping each step's trained samples (responses, their weight versions) and the trainer's version."""

    class Recording(base):
        def collect(self, prompts):
            batch, metrics = super().collect(prompts)
            self.trained = getattr(self, "trained", [])
            self.trained.append({"uid": list(batch["uid"]), "responses": batch["responses"].clone(),
                                 "versions": batch["weight_version"].clone(), "at": self.step_no})
            return batch, metrics

    return Recording


def fit(trainer, cfg):
    tracker = Tracker(cfg, cfg.trainer.experiment, "async-test", stage="rl")
    try:
        trainer.fit(tracker)
        tracker.finish()
    finally:
        trainer.close()
    return tracker.run_id


def configured(cfg, out, **trainer):
    cfg.trainer.steps, cfg.trainer.eval_every, cfg.trainer.save_every = 3, 0, 0
    cfg.trainer.out_dir = str(out)
    cfg.resources.threads_per_worker = 1  # both modes compute with the same threads, so their floats agree
    for key, value in trainer.items():
        setattr(cfg.trainer, key, value)
    return cfg


def test_async_with_no_staleness_trains_on_what_sync_does(tiny_config, tmp_path):
    import copy

    sync_cfg = configured(copy.deepcopy(tiny_config), tmp_path / "sync")
    sync = recording(RLTrainer)(sync_cfg)
    fit(sync, sync_cfg)
    async_cfg = configured(copy.deepcopy(tiny_config), tmp_path / "async", mode="async", max_staleness=0)
    asynchronous = recording(AsyncRLTrainer)(async_cfg)
    run_id = fit(asynchronous, async_cfg)

    assert len(sync.trained) == len(asynchronous.trained) == 3
    for step, (a, b) in enumerate(zip(sync.trained, asynchronous.trained)):
        assert a["uid"] == b["uid"], step
        assert torch.equal(a["responses"], b["responses"]), step  # the same seeded draws from the same weights
        assert torch.equal(b["versions"], torch.full_like(b["versions"], step)), step  # drawn by the newest weights
    ours = load_file(tmp_path / "async" / "checkpoint" / "model.safetensors")
    theirs = load_file(tmp_path / "sync" / "checkpoint" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.allclose(ours[name], theirs[name], atol=1e-6), name
    metrics = MlflowClient(async_cfg.tracking.uri).get_run(run_id).data.metrics
    assert metrics["async/staleness_max"] == 0 and metrics["async/dropped_groups"] == 0
    for key in ("timing_s/wait_rollout", "timing_s/wait_weights", "async/staleness_mean", "async/buffer_batches",
                "val/acc"):
        assert key in metrics, key


def test_a_slow_rollout_rank_never_gets_a_sample_past_max_staleness_trained(tiny_config, tmp_path):
    cfg = configured(tiny_config, tmp_path / "slow", mode="async", max_staleness=1, steps=4)
    cfg.actor.rollout_correction = "token"
    prepare_run_config(cfg)
    trainer = recording(AsyncRLTrainer)(cfg)
    trainer.rollout_worker = SlowRollout
    run_id = fit(trainer, cfg)

    stalenesses = [int(r["at"] - r["versions"].min()) for r in trainer.trained]
    assert len(stalenesses) == 4 and max(stalenesses) <= 1
    assert max(stalenesses) == 1  # the trainer did overlap with generation: a batch was drawn one version back
    client = MlflowClient(cfg.tracking.uri)
    history = client.get_metric_history(run_id, "async/staleness_max")
    assert [p.value for p in sorted(history, key=lambda p: p.step)] == [float(s) for s in stalenesses]
    metrics = client.get_run(run_id).data.metrics
    assert metrics["actor/rollout_is_max"] <= cfg.actor.rollout_is_cap
    assert metrics["timing_s/wait_rollout"] > 0
