"""Episodes a person can look at: a sample of each step's episodes as MLflow traces (``tracking.trace_episodes``),
planned from the batch (pure) and logged to a real MLflow tracking server, then searched back."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest
import torch
from PIL import Image

from mmrl.config import Config
from mmrl.protocol import Batch
from mmrl.run_config import run_dict
from mmrl.trainer.episodes import AgentEpisodes, SingleTurn
from mmrl.trainer.traces import episode_plan, picked

ROOT = Path(__file__).resolve().parents[2]


def png(colour: str, size: int = 8) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def zoom(turn: int, failure: str | None = None) -> dict:
    return {"turn": turn, "name": "zoom_in", "arguments": {"bbox_2d": [0, 0, 4, 4]}, "failure": failure,
            "text": "Error: timed out" if failure else "zoomed", "images": [] if failure else [png("blue")],
            "repairs": ["clamped_bbox"] if not failure else []}


# As mmrl.agent.rollout.episode_record makes them: a zoom then the answer; a timed-out zoom, a malformed call, cut.
RECORDS = [
    {"turns": [{"role": "assistant", "text": "call"}, {"role": "tool", "calls": [0]},
               {"role": "assistant", "text": "<answer>blue</answer>"}], "calls": [zoom(0)], "cut": None,
     "final_text": "<answer>blue</answer>"},
    {"turns": [{"role": "assistant", "text": "call"}, {"role": "tool", "calls": [0]},
               {"role": "assistant", "text": "again"}, {"role": "tool", "calls": [1]}],
     "calls": [zoom(0, "timeout"), {"turn": 1, "name": None, "error": "bad_json", "failure": "bad_json",
                                    "text": "Error: bad JSON", "images": []}],
     "cut": "max_turns", "final_text": "again"},
]


def batch(episodes: bool = True) -> Batch:
    rewards = torch.zeros(2, 4)
    rewards[0, 3] = 1.0
    objects = {"uid": ["p7", "p9"], "data_source": ["colour", "colour"], "images": [[png("red")], [png("green")]],
               "messages": [[{"role": "user", "content": "<image>What colour?"}]] * 2,
               "response_text": ["<answer>blue</answer>", "again"]}
    if episodes:
        objects["episode"] = RECORDS
    return Batch(tensors={"token_level_rewards": rewards, "correct": torch.tensor([1.0, 0.0]),
                          "weight_version": torch.tensor([3, 2])}, objects=objects)


def config(k: int) -> Config:
    cfg = Config()
    cfg.tracking.trace_episodes = k
    return cfg


def test_the_traced_samples_are_spread_evenly_over_the_batch():
    assert picked(8, 4) == [0, 2, 4, 6]
    assert picked(3, 5) == [0, 1, 2]
    assert picked(5, 0) == []


def test_an_episode_plans_a_span_per_policy_turn_and_per_tool_call_in_order():
    root, children = episode_plan(batch(), 1, step=4)
    assert [c.name for c in children] == ["turn_0", "zoom_in", "turn_1", "malformed_call"]
    assert root.attributes.items() >= {"mmrl.step": 4, "mmrl.sample": 1, "mmrl.uid": "p9", "mmrl.reward": 0.0,
                                       "mmrl.correct": 0.0, "mmrl.weight_version": 2, "mmrl.cut": "max_turns"}.items()
    assert root.inputs["prompt"] == "<image>What colour?" and root.inputs["images"][0].content_bytes == png("green")
    timed_out, malformed = children[1], children[3]
    assert timed_out.attributes["mmrl.failure"] == "timeout" and timed_out.outputs["images"] == []
    assert malformed.inputs == {"error": "bad_json"} and malformed.attributes["mmrl.failure"] == "bad_json"
    first = episode_plan(batch(), 0, step=4)[1]
    assert first[1].outputs["images"][0].content_bytes == png("blue")
    assert first[1].attributes["mmrl.repairs"] == ["clamped_bbox"] and first[2].outputs == "<answer>blue</answer>"


def test_a_single_turn_sample_is_a_trace_of_its_root_span_alone():
    root, children = episode_plan(batch(episodes=False), 0, step=1)
    assert children == [] and root.outputs == "<answer>blue</answer>" and root.attributes["mmrl.reward"] == 1.0
    assert "mmrl.cut" not in root.attributes


def test_tracing_is_off_by_default_and_then_leaves_the_records_hashes_as_they_were():
    assert SingleTurn(config(0)).trace(batch(), step=1) == 0
    assert "trace_episodes" not in run_dict(Config())["tracking"]
    assert run_dict(config(2))["tracking"]["trace_episodes"] == 2
    from pipelines.results import config_hash

    record = json.loads((ROOT / "results/demo/seed0.json").read_text())
    assert config_hash(record["config"], [*record["args"], f"seed={record['seed']}"]) == record["config_sha256"]


SERVER_START_S = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A real MLflow tracking server (sqlite backend, proxied artifacts) on a free port."""
    root, port = tmp_path_factory.mktemp("mlflow"), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                             f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        # About 10 s on an idle machine; `make test` runs the unit tests at nice 19 beside the Ray suite, where the
        # server (niced too) waits for the cores (it once missed a 30 s limit there).
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None, "the MLflow server exited"
                if time.monotonic() > deadline:
                    pytest.fail(f"the MLflow server did not answer in {SERVER_START_S:.0f} s")
                time.sleep(0.25)
        yield uri, root / "artifacts"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the uvicorn worker it starts
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_a_step_s_episodes_are_searchable_traces_of_the_run_with_their_spans_and_attributes(server, monkeypatch):
    server, artifacts = server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    # MLflow's process-wide URI and experiment, put back after the test
    monkeypatch.setattr(mlflow.tracking._tracking_service.utils, "_tracking_uri", None)
    monkeypatch.setattr(mlflow.tracking.fluent, "_active_experiment_id", None)
    mlflow.set_tracking_uri(server)
    experiment = mlflow.set_experiment("traces").experiment_id
    with mlflow.start_run() as run:
        assert AgentEpisodes(config(5)).trace(batch(), step=3) == 2
    mlflow.flush_trace_async_logging()
    traces = mlflow.search_traces(locations=[experiment], run_id=run.info.run_id, return_type="list",
                                  order_by=["timestamp_ms ASC"])
    assert len(traces) == 2
    by_sample = {t.info.tags["mmrl.sample"]: t for t in traces}
    first, second = by_sample["0"], by_sample["1"]
    assert [s.name for s in first.data.spans] == ["episode", "turn_0", "zoom_in", "turn_1"]
    assert [s.name for s in second.data.spans] == ["episode", "turn_0", "zoom_in", "turn_1", "malformed_call"]
    root = first.data.spans[0]
    assert root.attributes["mmrl.reward"] == 1.0 and root.attributes["mmrl.weight_version"] == 3
    assert first.info.tags["mmrl.step"] == "3" and first.info.tags["mmrl.uid"] == "p7"
    assert first.info.request_metadata["mlflow.sourceRun"] == run.info.run_id
    tool = first.data.spans[2]
    assert tool.attributes["mmrl.tool"] == "zoom_in" and tool.inputs == {"bbox_2d": [0, 0, 4, 4]}
    assert tool.outputs["text"] == "zoomed" and tool.outputs["images"][0].startswith("mlflow-attachment://")
    assert root.inputs["images"][0].startswith("mlflow-attachment://")
    assert second.data.spans[2].attributes["mmrl.failure"] == "timeout"
    stored = sorted(p.read_bytes() for p in artifacts.rglob("*") if p.is_file() and "attachments" in p.parts)
    assert stored == sorted([png("red"), png("blue"), png("green")])  # the prompts' two, the zoom's one
    found = mlflow.search_traces(locations=[experiment], filter_string="tag.`mmrl.sample` = '1'", return_type="list")
    assert [t.info.trace_id for t in found] == [second.info.trace_id]
