"""The async mode on real Ray pools: with max_staleness=0 it trains on exactly what the sync mode does; with a slow
rollout rank that dies once, no sample older than max_staleness is trained on and the pool is replaced without
stopping the trainer; a resumed run trains the prompts the interrupted one had in flight; a rollout rank frozen
mid-run is caught by its deadline and replaced, every step still training one whole, fresh batch; evaluation
waits for the batches in flight and survives a failed pool; with in-flight updates a running batch switches to the
weights published mid-generation, each token scored by the version that drew it, across a resume."""

import copy
import json
import os
import shutil
import signal
import time
from types import SimpleNamespace

import psutil
import pytest
import torch
from mlflow.tracking import MlflowClient
from PIL import Image
from safetensors.torch import load_file

from benchmarks.probes import UnreliableRollout
from data_prep.parquet import write_parquet
from data_prep.pixels import encode_png
from mmrl.controller import Dispatch, WorkerFailure, register
from mmrl.trainer.checkpoint import load_driver_state, resume_point
from mmrl.trainer.dataset import PromptLoader, load_rows
from mmrl.trainer.rl import RLTrainer
from mmrl.trainer.sources.pool import InFlight, PoolRollouts
from mmrl.trainer.tracking import Tracker
from mmrl.workers.rollout_worker import RolloutWorker


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


def hanging_rollout(on_call: int) -> type:
    """A rollout worker class whose rank 0 freezes its own process with SIGSTOP (as a stuck process would be: alive,
    silent) at its ``on_call``-th generation batch, once per run: it first leaves ``<trainer.out_dir>/rollout_hung``
    (its pid, the time) behind, and the rebuilt pool's ranks find it and go on. Defined here, so Ray ships it by
    value."""

    class HangingRollout(RolloutWorker):
        @register(Dispatch.ONE_TO_ALL)
        def init_model(self, cfg, checkpoint, transport=None):
            self.calls, self.marker = 0, os.path.join(cfg.trainer.out_dir, "rollout_hung")
            return super().init_model(cfg, checkpoint, transport)

        @register(Dispatch.DP_COMPUTE, fields=("messages", "images"), prompts=True, keep_prompts=False)
        def generate(self, prompts, params):
            self.calls += 1
            if self.rank == 0 and self.calls == on_call and not os.path.exists(self.marker):
                os.makedirs(os.path.dirname(self.marker), exist_ok=True)
                with open(self.marker, "w") as f:
                    json.dump({"pid": os.getpid(), "at": time.time()}, f)
                # The previous batch's result leaves this process after its call returned, from Ray's own threads:
                # stopped at once, the process could hold it back, and the trainer would time out on that batch.
                time.sleep(1.0)
                os.kill(os.getpid(), signal.SIGSTOP)
            return super().generate(prompts, params)

    return HangingRollout


def watch_restarts(source) -> list[dict]:
    """Each rebuild of ``source``'s rollout pool: its failure and how long after the trainer began to wait for a
    batch it came."""
    restarts, waits = [], []
    take, restart = source.take, source.restart_pool

    def timed_take():
        waits.append(time.monotonic())
        return take()

    def recorded_restart(failure):
        restarts.append({"failure": str(failure), "after_s": time.monotonic() - waits[-1]})
        restart(failure)

    source.take, source.restart_pool = timed_take, recorded_restart
    return restarts


def ended(pid: int, within_s: float) -> bool:
    """Whether process ``pid`` is gone (or a zombie: dead, not yet reaped) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


# A hung rollout rank replaced (the evaluation test below) and a step's deadline (tests/integration/test_recovery.py)
# stay in `make test`; this run of both in async mode, with its 10 s deadline, is in `make test-extra`.
@pytest.mark.extra
def test_a_rollout_rank_frozen_mid_run_is_caught_by_its_deadline_and_replaced(tiny_config, tmp_path):
    """GRPO in async mode, max_staleness=1, trainer.step_timeout_s=10 s: the rollout rank freezes its process (SIGSTOP)
    at its second batch, with the third queued behind it. The trainer's wait for that batch passes its deadline ten
    seconds after it began (not a death: the process lives), the pool is replaced (the stopped process killed) and
    both batches in flight are generated again with the newest weights; the trainer never restarts. Each of the 3
    steps trains one whole batch, the loader's next, none older than max_staleness; the rebuilt pool evaluates."""
    timeout = 10.0  # the tiny run's calls take about a second on 2 loaded cores
    cfg = configured(tiny_config, tmp_path / "hang", mode="async", max_staleness=1, step_timeout_s=timeout)
    trainer = recording(cfg, hanging_rollout(on_call=2))
    restarts = watch_restarts(trainer.source)
    started = time.monotonic()
    run_id = fit(trainer, cfg)
    print(f"hung-rank run: {time.monotonic() - started:.1f} s; restarts {restarts}")

    hung = json.loads((tmp_path / "hang" / "rollout_hung").read_text())
    assert len(restarts) == 1 and "treating them as hung" in restarts[0]["failure"]  # the deadline, not a death
    assert timeout - 0.5 <= restarts[0]["after_s"] < timeout + 10  # ray.wait may return a few ms early
    assert trainer.source.rollout_restarts == 1 and trainer.restarts == 0  # the pool was replaced, the trainer went on
    assert ended(hung["pid"], within_s=30), "the stopped rollout process was left behind"

    assert [r["at"] for r in trainer.trained] == [0, 1, 2]
    loader = PromptLoader(load_rows(cfg.data.dir, "train"), cfg.trainer.prompts_per_step, cfg.seed)
    assert [list(dict.fromkeys(r["uid"])) for r in trainer.trained] == [list(loader.next_batch()["uid"])
                                                                          for _ in range(3)]
    assert all(len(r["uid"]) == cfg.trainer.prompts_per_step * cfg.rollout.n for r in trainer.trained)  # whole
    # The frozen batch was submitted before step 1's update (so version 0); generated again, it is drawn with the
    # version that update published.
    assert torch.equal(trainer.trained[1]["versions"], torch.ones_like(trainer.trained[1]["versions"]))
    stalenesses = [int(r["at"] - r["versions"].min()) for r in trainer.trained]
    assert max(stalenesses) <= 1
    client = MlflowClient(cfg.tracking.uri)
    history = sorted(client.get_metric_history(run_id, "async/staleness_max"), key=lambda p: p.step)
    assert [p.value for p in history] == [float(s) for s in stalenesses]
    restart_history = sorted(client.get_metric_history(run_id, "async/rollout_restarts"), key=lambda p: p.step)
    assert [(p.step, p.value) for p in restart_history] == [(1, 0.0), (2, 1.0), (3, 1.0)]
    assert "val/acc" in client.get_run(run_id).data.metrics  # the last step's evaluation ran on the rebuilt pool


class FakePool:
    """A rollout pool's group (``name``) whose calls return at once, or raise WorkerFailure as a hung rank's do for
    the labels in ``hangs`` (the batches' "prompts" are labels; "eval" is the evaluation call). ``log``: its calls."""

    def __init__(self, name: str, hangs: set[str], log: list) -> None:
        self.name, self.hangs, self.log = name, hangs, log

    def run(self, label: str) -> tuple[str, str]:
        self.log.append((self.name, "done" if label not in self.hangs else "hung", label))
        if label in self.hangs:
            raise WorkerFailure(f"{self.name}: {label} did not finish: treating them as hung")
        return self.name, label

    def submit(self, method: str, label: str, params) -> SimpleNamespace:
        self.log.append((self.name, "submit", label))
        return SimpleNamespace(result=lambda: self.run(label))

    def generate(self, label: str, params) -> tuple[str, str]:
        return self.run(label)

    def shutdown(self) -> None:
        self.log.append((self.name, "shutdown", ""))


@pytest.mark.parametrize("hangs", [{"eval"}, {"b2"}])
def test_a_rollout_rank_hung_at_evaluation_or_before_it_is_replaced_and_the_evaluation_goes_on(hangs):
    """Evaluation waits for the two batches in flight first (so its calls have the pool to itself and their own
    deadlines); a hang in either, an evaluation call or the second batch, rebuilds the pool once, which generates
    again only the unfinished batch, and evaluates."""
    log: list = []
    source = PoolRollouts(SimpleNamespace(), "unused", SimpleNamespace())
    source.reset()
    source.pool = FakePool("A", hangs, log)
    source.build_pool = lambda: setattr(source, "pool", FakePool("B", set(), log))
    source.inflight.extend(InFlight(label, {}, source.pool.submit("generate", label, None)) for label in ("b1", "b2"))
    with source.serving() as generate:
        assert generate("eval", None) == ("B", "eval")

    assert source.rollout_restarts == 1
    again = [label for name, call, label in log if (name, call) == ("B", "submit")]
    assert again == ([] if hangs == {"eval"} else ["b2"])  # finished batches are kept, not drawn again
    assert [item.samples for item in source.inflight] == [("A", "b1"), ("A" if hangs == {"eval"} else "B", "b2")]
    waits = [i for i, (_, call, label) in enumerate(log) if call in ("done", "hung")]
    first_eval = next(i for i in waits if log[i][2] == "eval")
    assert {log[i][2] for i in waits if i < first_eval} == {"b1", "b2"}  # the batches in flight were waited for first


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


SWITCH_AT = 3  # the token before which a running batch waits for newer weights


def switching_rollout() -> type:
    """A rollout worker class (for max_staleness=1) whose ranks, from their second batch on, wait at token ``SWITCH_AT``
    (their in-flight poll there) until the trainer publishes newer weights than those they started the batch with:
    every such batch is switched mid-generation, at that token. A batch that starts with version v is trained at v + 1,
    after v + 1 was published, so a rank waits only when v + 1 is a step the run trains (and not in a pool's first
    batch: it may be trained at its own version, after a resume). Defined in a function, so Ray ships it by value."""

    class SwitchingRollout(RolloutWorker):
        @register(Dispatch.DP_COMPUTE, fields=("messages", "images"), prompts=True, keep_prompts=False)
        def generate(self, prompts, params):
            self.calls, self.polls = getattr(self, "calls", 0) + 1, 0
            return super().generate(prompts, params)

        def pull_weights(self):
            self.polls += 1  # poll 1 is the batch's start, poll 1 + j comes after token j - 1
            trained = self.version + 1 < self.cfg.trainer.steps
            if self.calls == 1 or self.polls != 1 + SWITCH_AT or not trained:
                return super().pull_weights()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if super().pull_weights():
                    return True
                time.sleep(0.02)
            return False

    return SwitchingRollout


def test_in_flight_updates_switch_a_running_batch_and_score_each_token_by_its_version(tiny_config, tmp_path):
    """GRPO in async mode, max_staleness=1, rollout.partial with a poll every token; each batch after the first waits
    at token 3 for the weights the trainer publishes meanwhile. The trained samples' first three tokens carry the older
    version, the rest the trainer's own; the trainer's recomputed log-probs equal the engine's within 1e-4 exactly on
    the tokens its own weights drew (and differ on the older ones: an entropy bonus moves the weights even when every
    reward is 0); a sample's staleness is its oldest token's. Run 2 steps, then resume to 4: the resumed run's first
    batch, drawn with its restored weights, is trained at that version, and its second is switched again."""
    cfg = configured(tiny_config, tmp_path / "partial", mode="async", max_staleness=1, steps=2, save_every=1)
    cfg.rollout.partial, cfg.rollout.partial_poll_tokens, cfg.rollout.max_new_tokens = True, 1, 8
    cfg.actor.entropy_coeff = 0.01
    seen = []

    class Scored(RLTrainer):
        def correct_rollouts(self, batch):
            seen.append({"at": self.step_no, **{key: batch[key].clone() for key in (
                "token_versions", "weight_version", "rollout_log_probs", "old_log_probs", "response_mask")}})
            return super().correct_rollouts(batch)

    for steps in (2, 4):
        cfg.trainer.steps = steps
        trainer = Scored(cfg)
        trainer.source.worker = switching_rollout()
        run_id = fit(trainer, cfg)
    assert [s["at"] for s in seen] == [0, 1, 2, 3]
    assert (seen[0]["token_versions"] == 0).all() and (seen[2]["token_versions"] == 2).all()
    for step in (seen[1], seen[3]):
        at, mask = step["at"], step["response_mask"] > 0
        long = mask[:, SWITCH_AT]  # rows still generating at the switch
        assert long.any()
        versions = step["token_versions"]
        assert (versions[:, :SWITCH_AT] == at - 1).all() and (versions[long, SWITCH_AT:] == at).all()
        assert torch.equal(step["weight_version"], versions[:, 0])  # a sample's staleness is its oldest token's
        diff = (step["rollout_log_probs"] - step["old_log_probs"]).abs()
        assert diff[mask & (versions == at)].max() < 1e-4
        assert diff[mask & (versions < at)].max() > 1e-3
    metrics = MlflowClient(cfg.tracking.uri).get_run(run_id).data.metrics
    assert metrics["async/staleness_max"] == 1 and 0 < metrics["async/inflight_token_share"] < 1
    assert metrics["async/token_staleness_mean"] < metrics["async/staleness_mean"]
