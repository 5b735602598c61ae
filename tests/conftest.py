"""Shared fixtures: a tiny VLM and small synthetic splits, built once per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from data_prep.parquet import write_parquet  # noqa: E402
from data_prep.synthetic import build_splits  # noqa: E402
from mmrl.config import Config, TinyModelConfig, load_config  # noqa: E402
from mmrl.models.tiny import build_tiny_vlm  # noqa: E402
from pipelines.model import task_corpus  # noqa: E402

SIZES = {"sft": 16, "train": 64, "val": 16, "test": 16}

@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-model")
    spec = TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=128, vision_hidden_size=32, vision_heads=2)
    return build_tiny_vlm(task_corpus(Config()), spec, out)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a head size vLLM's CPU attention supports (32; the default fixture's is 16)."""
    out = tmp_path_factory.mktemp("tiny-model-vllm")
    spec = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
                           vision_hidden_size=32, vision_heads=2)
    return build_tiny_vlm(task_corpus(Config()), spec, out)


# The families' tiny models: head size 32 (vLLM's CPU attention takes it), 64 wide, 2 layers.
FAMILY_SIZES = ["tiny_model.hidden_size=64", "tiny_model.num_layers=2", "tiny_model.num_heads=2",
                "tiny_model.num_kv_heads=1", "tiny_model.intermediate_size=128", "tiny_model.vision_hidden_size=32",
                "tiny_model.vision_heads=2"]


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny checkpoint per model family, each written by the ``make model`` stage (seconds for all four)."""
    from mmrl.models.families import FAMILIES
    from pipelines import model as model_stage

    out = {}
    for name in FAMILIES:
        path = tmp_path_factory.mktemp(f"tiny-{name}")
        model_stage.main(["--config", "", f"model.family={name}", f"model.path={path}", *FAMILY_SIZES])
        out[name] = path
    return out


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data")
    splits = build_splits({"colour": 0.5, "count": 0.5}, SIZES, seed=0, image_size=56)
    for split, rows in splits.items():
        write_parquet(rows, out / f"{split}.parquet")
    return out


@pytest.fixture(scope="session")
def empty_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sqlite MLflow store with its tables and no runs: MLflow's schema migrations cost about 2 s per new
    store, so each test's private store starts as a copy of this one."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def tiny_config(tiny_model_dir: Path, tiny_data_dir: Path, empty_mlflow_db: Path, tmp_path: Path) -> Config:
    """A config pointing at the tiny model and data, with a private MLflow store. Loaded, not resolved: a test
    may change it before the run, whose RLTrainer checks and resolves it (mmrl.run_config.prepare_run_config)."""
    shutil.copyfile(empty_mlflow_db, tmp_path / "mlflow.db")
    return load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            f"trainer.init={tiny_model_dir}",
            f"data.dir={tiny_data_dir}",
            f"trainer.out_dir={tmp_path / 'rl'}",
            f"sft.out_dir={tmp_path / 'sft'}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"tracking.artifact_dir={tmp_path / 'artifacts'}",
            "trainer.prompts_per_step=4",
            "trainer.val_size=8",
            "rollout.n=4",
            "rollout.max_new_tokens=6",
            "actor.num_mini_batches=2",
            "model.compile=false",  # eager: the suite would compile in each worker process; tests/unit/test_fused.py checks it
            "resources.reuse_workers=true",  # the suite's ~50 runs start their ranks in warm processes
            # Logging the policy as an MLflow model, sampling system metrics and measuring the matmul peak (about
            # a second) cost each run time; the test of the MLflow run turns them on
            # (tests/integration/test_rl_pipeline.py).
            "tracking.log_model=false",
            "tracking.system_metrics=false",
            "tracking.mfu=false",
        ],
    )


@dataclass
class Kill:
    """What :func:`run_with_a_kill` did: the pid it killed, when, and the trainer after the run."""

    pid: int
    rank: int
    node: str
    killed_at: float
    trainer: object
    run_id: str


@pytest.fixture
def run_with_a_kill():
    """Run RL with ``cfg`` and send ``sig`` (SIGKILL: dies; SIGSTOP: hangs) to actor rank ``rank`` (or to
    the rank on Ray node ``node``) as soon as ``step_<after_step>`` is saved."""
    import signal
    import threading
    import time

    from mmrl.trainer.tracking import Tracker
    from mmrl.trainer.rl import RLTrainer
    from benchmarks.probes import ProbedActor

    class ProbedTrainer(RLTrainer):
        actor_worker = ProbedActor  # its ranks tell their pids

    def run(cfg: Config, after_step: int, rank: int = 0, node: str | None = None, sig: int = signal.SIGKILL) -> Kill:
        trainer = ProbedTrainer(cfg)
        tracker = Tracker(cfg, cfg.trainer.experiment, "killed", stage="rl")
        marker = Path(cfg.trainer.out_dir) / f"step_{after_step}" / "meta.json"
        killed: list[tuple[int, int, str, float]] = []

        def kill() -> None:
            deadline = time.monotonic() + 300
            while not marker.is_file() and time.monotonic() < deadline:
                time.sleep(0.01)
            nodes, pids = trainer.workers.node_id(), trainer.workers.pid()
            target = nodes.index(node) if node is not None else rank
            pid = pids[target]
            os.kill(pid, sig)
            killed.append((pid, target, nodes[target], time.time()))

        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        try:
            trainer.fit(tracker)
            tracker.finish()
        except BaseException:
            tracker.finish("FAILED")
            raise
        finally:
            trainer.shutdown()
        killer.join(timeout=60)
        assert killed, f"the kill never happened ({marker} never appeared)"
        pid, target, on_node, when = killed[0]
        return Kill(pid=pid, rank=target, node=on_node, killed_at=when, trainer=trainer, run_id=tracker.run_id)

    return run


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Torch on one thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``): the tiny model gains
    nothing from a second thread, and on a loaded machine the two wait for each other (one scripted agent run: 0.35 s
    on one thread, 6 s on two)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
