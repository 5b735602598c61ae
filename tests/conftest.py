"""Shared fixtures: a tiny VLM and small synthetic splits, built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from data_prep.schema import write_parquet  # noqa: E402
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
def tiny_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data")
    splits = build_splits({"colour": 0.5, "count": 0.5}, SIZES, seed=0, image_size=56)
    for split, rows in splits.items():
        write_parquet(rows, out / f"{split}.parquet")
    return out


@pytest.fixture
def tiny_config(tiny_model_dir: Path, tiny_data_dir: Path, tmp_path: Path) -> Config:
    """A config pointing at the tiny model and data, with a private MLflow store."""
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
        ],
    )
