"""GRPO through real Ray workers on the tiny model, tracked in a real MLflow store."""

import gzip
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import mlflow.pyfunc
import pytest
import torch
from mlflow.tracking import MlflowClient
from PIL import Image
from safetensors.torch import load_file

from benchmarks.probes import ProbedActor
from mmrl.controller import ResourcePool, WorkerGroup
from mmrl.rollout.base import SamplingParams
from mmrl.trainer.dataset import load_rows, rows_to_batch
from mmrl.trainer.run import run_rl


class UIServer:
    """``make ui``'s server process; :meth:`url` waits until it serves."""

    def __init__(self, process: subprocess.Popen, base: str) -> None:
        self.process, self.base = process, base

    def url(self) -> str:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{self.base}/health", timeout=2)
                return self.base
            except OSError:
                assert self.process.poll() is None and time.monotonic() < deadline, "the MLflow server did not come up"
                time.sleep(0.3)


@contextmanager
def mlflow_ui(uri: str):
    """``make ui``'s server (one worker, no job runners) started on a free local port, at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    process = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--workers", "1", "--backend-store-uri", uri,
                                "--host", "127.0.0.1", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        yield UIServer(process, f"http://127.0.0.1:{port}")
    finally:
        process.terminate()
        process.wait(timeout=30)


def rest(base: str, path: str) -> dict:
    with urllib.request.urlopen(f"{base}/api/2.0/mlflow/{path}", timeout=30) as response:
        return json.load(response)


def test_two_grpo_steps_log_to_mlflow(tiny_config, reference_greedy):
    cfg = tiny_config
    cfg.trainer.steps, cfg.trainer.eval_every = 2, 1
    cfg.actor.use_kl_loss = True  # exercises the reference policy too
    cfg.tracking.log_model, cfg.tracking.system_metrics, cfg.tracking.system_metrics_interval_s = True, True, 1.0
    cfg.tracking.mfu = True
    cfg.tracking.register_model = "tiny-policy"
    cfg.trainer.profile_steps = [2]
    with mlflow_ui(cfg.tracking.uri) as ui:  # the UI's server starts while the run trains: it reads the store live
        result = run_rl(cfg)
        check_the_run(cfg, result, ui, reference_greedy)


def check_the_run(cfg, result, ui: UIServer, reference_greedy) -> None:
    client = MlflowClient(cfg.tracking.uri)
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["rollout.n"] == "4" and run.data.params["algorithm.name"] == "grpo"
    for name in ("actor.update", "actor.log_probs", "rollout.generate"):  # nothing set: sized by the workers
        assert run.data.params[f"micro_batching.{name}"].endswith("tokens (auto)"), name
    for key in ["actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/grad_norm",
                "actor/kl_loss", "critic/score/mean", "response_length/mean", "timing_s/gen", "timing_s/ref",
                "timing_s/old_log_prob",  # 2 mini-batches: the second is off-policy, so old log-probs are recomputed
                "perf/throughput", "val/acc", "reward/answer_match/failures", "reward/failed_samples"]:
        assert key in run.data.metrics, key
    assert [m.step for m in client.get_metric_history(run.info.run_id, "actor/pg_loss")] == [1, 2]
    sources = {k for k in run.data.metrics if k.startswith("val/synthetic")}
    assert sources == {"val/synthetic/colour/acc", "val/synthetic/count/acc"}
    # The training forward (old log-probs) reproduces the rollout's log-probs for the same weights.
    for point in client.get_metric_history(run.info.run_id, "rollout/logprob_diff_max"):
        assert point.value < 1e-4
    # The MFU account: each timed phase's share of the peak measured at the run's start (mmrl.perf).
    [peak] = client.get_metric_history(run.info.run_id, "perf/peak_tflops")
    assert peak.step == 0 and peak.value > 0
    for phase in ("gen", "gen/vision", "gen/prefill", "gen/decode", "old_log_prob", "ref", "update_actor"):
        assert 0 < run.data.metrics[f"perf/mfu/{phase}"] < 1, phase
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"curves.png", "rollouts", "profile"} <= artifacts
    profiled = Path(client.download_artifacts(run.info.run_id, "profile/step_2"))
    assert {p.name for p in profiled.iterdir()} == {"trace_rank0.json.gz", "ops_rank0.txt", "phases.txt"}
    spans = {e.get("name") for e in json.loads(gzip.decompress((profiled / "trace_rank0.json.gz").read_bytes()))[
        "traceEvents"]}
    assert {"mmrl.generate", "mmrl.decode", "mmrl.compute_log_probs", "mmrl.update_actor"} <= spans
    assert "aten::mm" in (profiled / "ops_rank0.txt").read_text()
    tables = {a.path for a in client.list_artifacts(run.info.run_id, "rollouts")}
    assert "rollouts/step_00001.html" in tables and "rollouts/step_00002.json" in tables
    assert (Path(cfg.trainer.out_dir) / "checkpoint" / "config.json").is_file()

    # What a user of MLflow expects: tags to filter by, a training experiment, the splits as dataset inputs with
    # their counts, system metrics, and the policy as a model that loads back and answers (and is registered).
    tags = run.data.tags
    assert {k: tags[k] for k in ("mmrl.stage", "mmrl.algorithm", "mmrl.model_family", "mmrl.engine", "mmrl.mode")} == {
        "mmrl.stage": "rl", "mmrl.algorithm": "grpo", "mmrl.model_family": "qwen2_5_vl", "mmrl.engine": "hf",
        "mmrl.mode": "sync"}
    assert len(tags["mmrl.git_commit"].split("+")[0]) == 40
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    inputs = {i.dataset.name: i for i in run.inputs.dataset_inputs}
    assert set(inputs) == {"sft", "train", "val", "test"}
    for name, item in inputs.items():
        profile = json.loads(item.dataset.profile)
        assert profile["num_rows"] == len(load_rows(cfg.data.dir, name)) and profile["num_quarantined"] == 0
    contexts = {name: {t.key: t.value for t in item.tags}["mlflow.data.context"] for name, item in inputs.items()}
    assert contexts == {"sft": "training", "train": "training", "val": "validation", "test": "testing"}
    assert any(key.startswith("system/cpu_utilization") for key in run.data.metrics)
    assert any(key.startswith("system/system_memory_usage") for key in run.data.metrics)
    [output] = run.outputs.model_outputs
    policy = mlflow.pyfunc.load_model(f"models:/{output.model_id}")
    row = load_rows(cfg.data.dir, "val", limit=1)[0]
    [answer] = policy.predict([{"prompt": row["messages"][0]["content"], "images": row["images"], "max_new_tokens": 6}])
    image = Image.open(io.BytesIO(row["images"][0]))
    assert answer == reference_greedy(Path(cfg.trainer.out_dir) / "checkpoint", [(row["messages"], [image])], 6)[0]
    assert client.get_latest_versions("tiny-policy")[0].run_id == run.info.run_id

    # The UI's server reads the same run, its inputs, its model and its artifacts through its REST API.
    base = ui.url()
    served = rest(base, f"runs/get?run_id={run.info.run_id}")["run"]
    assert {i["dataset"]["name"] for i in served["inputs"]["dataset_inputs"]} == set(inputs)
    assert served["outputs"]["model_outputs"][0]["model_id"] == output.model_id
    model = rest(base, f"logged-models/{output.model_id}")["model"]
    assert model["info"]["source_run_id"] == run.info.run_id and model["info"]["name"] == "policy"
    listed = {f["path"] for f in rest(base, f"artifacts/list?run_id={run.info.run_id}")["files"]}
    assert {"curves.png", "rollouts", "checkpoint_path.txt"} <= listed


@pytest.fixture
def two_workers(tiny_config):
    cfg = tiny_config
    cfg.resources.num_workers = 2
    cfg.actor.micro_batch_size = 4  # groups of 3 samples: plain 4-row slices would cut prompts in two
    group = WorkerGroup(ProbedActor, ResourcePool(2, cpus_per_worker=1, reuse=True), threads=1, device="cpu")
    group.init_model(cfg, cfg.model.path)
    yield cfg, group
    group.shutdown()


def test_two_workers_keep_each_prompt_on_one_rank_and_encode_it_once_per_pass(two_workers):
    """5 prompts x 3 samples over 2 ranks: each prompt's samples stay on the rank that generated them, that rank
    holds its encoding, and every pass (rollout, log-probs, each epoch of the update) runs the vision tower once
    per distinct image, whatever the micro-batch size."""
    cfg, group = two_workers
    prompts = rows_to_batch(load_rows(cfg.data.dir, "train", limit=5))  # 5 prompts: uneven over 2 ranks
    images = sum(len(i) for i in prompts["images"])
    group.forget_prompts()
    group.vision_passes()
    samples = group.generate(prompts, SamplingParams(n=3, max_new_tokens=6))
    assert len(samples) == 15 and "prompt" not in samples.objects  # the pixels stay on the workers
    assert all(samples["image_grids"][3 * i] is samples["image_grids"][3 * i + 2] for i in range(5))
    assert samples["weight_version"].tolist() == [0] * 15
    held = group.held_prompts()
    assert sorted(u for rank in held for u in rank) == sorted(prompts["uid"])  # each on exactly one rank
    assert all(rank for rank in held)  # both ranks got work
    assert sum(group.vision_passes()) == images
    batch = prompts.repeat(3).union(samples)
    batch = batch.union(group.compute_log_probs(batch))
    assert sum(group.vision_passes()) == images
    assert group.held_prompts() == held  # the log-prob pass found every prompt where it was
    mask = batch["response_mask"]
    assert float(((batch["old_log_probs"] - batch["rollout_log_probs"]).abs() * mask).max()) < 1e-4
    batch.tensors["advantages"] = torch.randn(15, 1) * mask
    metrics = group.update_actor(batch)
    assert sum(group.vision_passes()) == images * cfg.actor.ppo_epochs
    assert metrics[0] == metrics[1]  # metrics are reduced over ranks
    assert group.versions() == [(1, 0), (1, 0)]  # the update moved the actor on; the engine syncs when asked
    assert group.sync_weights(False) == [1, 1] and group.sync_weights(True) == [0, 0]
    # A new step forgets the driver's placement and the ranks' encodings: the same prompts drawn again (the next
    # epoch) get their media again.
    group.forget_prompts()
    assert group.placement == {} and group.held_prompts() == [[], []]
    assert len(group.generate(prompts, SamplingParams(n=1, max_new_tokens=2))) == 5
    state0, state1 = group.full_state_dict()
    # Gradients were summed over ranks: both hold the same weights.
    assert all(torch.equal(state0[k], state1[k]) for k in state0)


# A colocated critic on 2 FSDP ranks also runs in test_checkpoints' PPO resume test: `make test-extra` runs it here.
@pytest.mark.parametrize("placement", [pytest.param("colocate", marks=pytest.mark.extra), "separate"])
def test_ppo_with_a_sharded_critic_runs_end_to_end(tiny_config, tmp_path, placement):
    """PPO + GAE: a critic group (own layout, colocated or in its own pool) beside a 2-rank sharded actor."""
    cfg = tiny_config
    # The untrained model never answers right; a length reward gives the critic non-zero returns to fit.
    plugin = tmp_path / "length_reward.py"
    plugin.write_text("def score(response, ground_truth):\n    return len(response) / 10\n")
    cfg.reward.function, cfg.reward.weights = f"{plugin}:score", {}
    cfg.algorithm.name = "ppo"
    cfg.trainer.steps, cfg.trainer.eval_every = 2, 2
    cfg.resources.num_workers = 2
    cfg.actor.vision.strategy, cfg.actor.llm.strategy = "replicate", "fsdp"
    cfg.critic.vision.strategy, cfg.critic.llm.strategy = "fsdp", "replicate"
    cfg.critic.placement = placement
    cfg.actor.llm.activation_checkpointing = cfg.critic.vision.activation_checkpointing = True  # on sharded parts
    result = run_rl(cfg)
    client = MlflowClient(cfg.tracking.uri)
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["micro_batching.critic.update"].endswith("tokens (auto)")
    for key in ["critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm",
                "critic/values/mean", "critic/returns/mean", "critic/vf_explained_var", "timing_s/values",
                "timing_s/update_critic", "actor/pg_loss", "val/acc", "perf/max_memory_gb/actor",
                "perf/max_memory_gb/critic", "perf/max_memory_gb"]:
        assert key in run.data.metrics, key
    peaks = {k: v for k, v in run.data.metrics.items() if k.startswith("perf/max_memory_gb")}
    assert 0 < peaks["perf/max_memory_gb/critic"] and peaks["perf/max_memory_gb"] == max(peaks.values())
    losses = [m.value for m in client.get_metric_history(run.info.run_id, "critic/vf_loss")]
    assert len(losses) == 2 and all(v > 0 for v in losses)  # zero-initialised head vs non-zero returns
    assert (Path(cfg.trainer.out_dir) / "checkpoint" / "config.json").is_file()
    critic = load_file(str(Path(cfg.trainer.out_dir) / "critic" / "value_model.safetensors"))
    assert critic["value_head.weight"].shape == (1, 64) and float(critic["value_head.weight"].abs().sum()) > 0
