"""The async mode on real Ray pools: with max_staleness=0 it trains on exactly what the sync mode does; with a slow
rollout rank that dies once, no sample older than max_staleness is trained on and the pool is replaced without
stopping the trainer; a resumed run trains the prompts the interrupted one had in flight."""

import copy
import shutil

import pytest
import torch
from mlflow.tracking import MlflowClient
from PIL import Image
from safetensors.torch import load_file

from data_prep.parquet import write_parquet
from data_prep.pixels import encode_png

from mmrl.trainer.tracking import Tracker
from mmrl.trainer.checkpoint import load_driver_state, resume_point
from mmrl.trainer.rl import RLTrainer
from benchmarks.probes import UnreliableRollout
from mmrl.trainer.dataset import PromptLoader, load_rows


def recording(cfg, worker: type | None = None) -> RLTrainer:
    """A trainer (of ``trainer.mode``) keeping each step's trained samples (responses, their weight versions) and the
    trainer's version; ``worker``: the rollout pool's worker class."""

    class Recording(RLTrainer):
        def collect(self, prompts):
            batch, metrics = super().collect(prompts)
            self.trained = getattr(self, "trained", [])
            self.trained.append({"uid": list(batch["uid"]), "responses": batch["responses"].clone(),
                                 "versions": batch["weight_version"].clone(), "at": self.step_no})
            return batch, metrics

    trainer = Recording(cfg)
    if worker is not None:
        trainer.source.worker = worker
    return trainer


def fit(trainer, cfg):
    """``run_rl``'s loop for a given trainer: resumes from the newest checkpoint of its out_dir, in its MLflow run."""
    resume = resume_point(cfg)
    run_id = load_driver_state(resume).mlflow_run_id if resume is not None else None
    tracker = Tracker(cfg, cfg.trainer.experiment, "async-test", stage="rl", resume_run_id=run_id)
    try:
        trainer.fit(tracker, resume)
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


def mixed_data(tiny_data_dir, out):
    """The tiny data's splits, its train split's first rows made text-only, two-image, video and image + video
    prompts."""
    rows = load_rows(tiny_data_dir, "train", limit=12)
    clip = {"frames": [encode_png(Image.new("RGB", (56, 56), c)) for c in [(200, 20, 20)] * 2 + [(20, 200, 20)] * 2],
            "timestamps": [0.0, 0.5, 1.0, 1.5]}
    rows[0] |= {"messages": [{"role": "user", "content": "Name a colour."}], "images": []}
    rows[1] |= {"messages": [{"role": "user", "content": "<image><image>Same colour?"}],
                "images": [rows[1]["images"][0], rows[2]["images"][0]]}
    rows[2] |= {"messages": [{"role": "user", "content": "<video>Which colour first?"}], "images": [], "videos": [clip]}
    rows[3] |= {"messages": [{"role": "user", "content": "<image><video>Same?"}], "videos": [clip]}
    out.mkdir()
    write_parquet(rows, out / "train.parquet")
    shutil.copyfile(tiny_data_dir / "val.parquet", out / "val.parquet")
    return out


def test_async_with_no_staleness_trains_on_what_sync_does(tiny_config, tiny_data_dir, tmp_path):
    """On text, image, two-image, video and image + video prompts (the trainer encodes them itself, from the same
    media the rollout pool got): the same samples, log-probs within 1e-4 of the engine's, the same weights."""
    tiny_config.data.dir = str(mixed_data(tiny_data_dir, tmp_path / "data"))
    sync_cfg = configured(copy.deepcopy(tiny_config), tmp_path / "sync")
    sync = recording(sync_cfg)
    fit(sync, sync_cfg)
    async_cfg = configured(copy.deepcopy(tiny_config), tmp_path / "async", mode="async", max_staleness=0)
    asynchronous = recording(async_cfg)
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
    client = MlflowClient(async_cfg.tracking.uri)
    assert {p.step for p in client.get_metric_history(run_id, "rollout/logprob_diff_max")} == {1, 2, 3}
    assert all(p.value < 1e-4 for p in client.get_metric_history(run_id, "rollout/logprob_diff_max"))
    mixed = {str(r["id"]) for r in load_rows(tiny_config.data.dir, "train", limit=4)}
    assert mixed <= {uid for r in asynchronous.trained for uid in r["uid"]}  # 12 rows, 3 x 4 prompts: one epoch
    metrics = client.get_run(run_id).data.metrics
    assert metrics["async/staleness_max"] == 0 and metrics["async/dropped_groups"] == 0
    for key in ("timing_s/wait_rollout", "timing_s/wait_weights", "async/staleness_mean", "async/buffer_batches",
                "val/acc"):
        assert key in metrics, key


def test_a_ppo_run_with_a_slow_dying_rollout_rank_stays_fresh_and_resumes_with_its_batches_in_flight(
        tiny_config, tmp_path):
    """PF-PPO (a critic and a filter) in async mode, max_staleness=1, the rollout correction on, a rollout rank
    0.3 s slower per batch that kills its own process at its second batch. Run 2 steps (saved with a batch in flight), then resume
    to 4: no trained sample is ever more than one version old and one is exactly one; the pool was replaced once
    and the trainer never restarted; the resumed run trains the batch that was in flight (the loader counts only
    trained prompts), so both runs together train the loader's first four batches in order."""
    cfg = configured(tiny_config, tmp_path / "ppo", mode="async", max_staleness=1, steps=2)
    # PF-PPO: PPO's critic, and a filter that keeps the best and the worst response of each group.
    cfg.algorithm.name, cfg.algorithm.pf_ppo.filter_mode = "pf_ppo", "best_and_worst"
    cfg.actor.rollout_correction = "token"
    first = recording(cfg, UnreliableRollout)  # 0.3 s slower per batch; its process exits at its 2nd batch, once
    fit(first, cfg)
    assert first.source.rollout_restarts == 1 and first.restarts == 0  # the pool was replaced, the trainer went on
    cfg.trainer.steps = 4
    resumed = recording(cfg, UnreliableRollout)  # its marker is left: it lives
    run_id = fit(resumed, cfg)

    trained = first.trained + resumed.trained
    assert [r["at"] for r in trained] == [0, 1, 2, 3]
    stalenesses = [int(r["at"] - r["versions"].min()) for r in trained]
    assert max(stalenesses) == 1  # never older than max_staleness; the trainer did overlap with generation
    loader = PromptLoader(load_rows(cfg.data.dir, "train"), cfg.trainer.prompts_per_step, cfg.seed)
    assert [list(dict.fromkeys(r["uid"])) for r in trained] == [list(loader.next_batch()["uid"]) for _ in range(4)]
    assert all(len(r["uid"]) == 2 * cfg.trainer.prompts_per_step for r in trained)  # the filter's two per group
    client = MlflowClient(cfg.tracking.uri)
    history = sorted(client.get_metric_history(run_id, "async/staleness_max"), key=lambda p: p.step)
    assert [p.value for p in history] == [float(s) for s in stalenesses]  # one MLflow run across the resume
    metrics = client.get_run(run_id).data.metrics
    assert 0 < metrics["actor/rollout_is_max"] <= cfg.actor.rollout_is_cap and "critic/vf_loss" in metrics
    assert metrics["async/rollout_restarts"] == 0 and resumed.source.rollout_restarts == 0


def test_the_drop_policy_trains_only_fresh_batches_and_counts_the_dropped(tiny_config, tmp_path):
    """stale_policy=drop, max_staleness=0: a batch drawn while the trainer was updating is one version old when its
    turn comes, so it is dropped; every trained sample is from the trainer's current weights."""
    cfg = configured(tiny_config, tmp_path / "drop", mode="async", max_staleness=0, stale_policy="drop", steps=2)
    trainer = recording(cfg)
    run_id = fit(trainer, cfg)

    assert [r["at"] for r in trainer.trained] == [0, 1]
    for record in trainer.trained:
        assert torch.equal(record["versions"], torch.full_like(record["versions"], record["at"]))
    client = MlflowClient(cfg.tracking.uri)
    dropped = [p.value for p in client.get_metric_history(run_id, "async/dropped_groups")]
    assert len(dropped) == 2 and sum(dropped) >= cfg.trainer.prompts_per_step  # at least one batch was dropped
    assert all(d % cfg.trainer.prompts_per_step == 0 for d in dropped)  # whole batches


@pytest.mark.extra  # the rollout pool on vLLM (a vLLM start per rank): `make test-extra`
def test_async_on_vllm_draws_with_the_published_weights(tiny_config, vllm_model_dir, tmp_path):
    """A vLLM rollout pool loads each published version before its batches: with max_staleness=0 every trained
    sample is from the trainer's current weights, and the trainer's log-probs match vLLM's within 1e-4."""
    cfg = configured(tiny_config, tmp_path / "vllm", mode="async", max_staleness=0)
    cfg.model.path, cfg.trainer.init, cfg.rollout.engine = str(vllm_model_dir), str(vllm_model_dir), "vllm"
    trainer = recording(cfg)
    run_id = fit(trainer, cfg)
    for record in trainer.trained:
        assert torch.equal(record["versions"], torch.full_like(record["versions"], record["at"]))
    history = MlflowClient(cfg.tracking.uri).get_metric_history(run_id, "rollout/logprob_diff_max")
    assert len(history) == 3 and all(p.value < 1e-4 for p in history)
