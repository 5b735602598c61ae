"""The sweep's table: the late means it reads back from a real MLflow store, and its rows as markdown."""

import shutil

import pytest

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from pipelines.sweep import late_mean, markdown, run_row


def test_late_means_are_over_the_last_tenth_of_the_logged_steps(empty_mlflow_db, tmp_path):
    db = tmp_path / "mlflow.db"
    shutil.copyfile(empty_mlflow_db, db)
    client = MlflowClient(f"sqlite:///{db}")
    run = client.create_run(client.create_experiment("sweep-test")).info.run_id
    flat = [i / 40 for i in range(40)]  # steps 1..40; the last tenth: steps 37-40
    client.log_batch(run, metrics=[Metric("critic/flat_groups", v, 0, i + 1) for i, v in enumerate(flat)]
                     + [Metric("timing_s/step", s, 0, i + 1) for i, s in enumerate([3.0, 1.0, 2.0])])
    assert late_mean(client, run, "critic/flat_groups") == pytest.approx(sum(flat[-4:]) / 4)
    assert late_mean(client, run, "actor/entropy") is None
    row = run_row(client, run)
    assert row["s_per_step"] == 2.0 and row["flat"] == pytest.approx(sum(flat[-4:]) / 4) and row["entropy"] is None


def test_the_table_keeps_failed_runs_with_their_error():
    table = markdown([{"variant": "grpo", "seed": 0, "sft_acc": 0.3625, "test_acc": 0.5, "gain": 0.1375},
                      {"variant": "bad", "seed": 0, "error": "ConfigError: no"}])
    lines = table.splitlines()
    assert lines[0].startswith("| variant | seed | sft_acc | test_acc | gain |") and len(lines) == 4
    assert "| grpo | 0 | 0.362 | 0.500 | 0.138 |" in lines[2] and lines[3].endswith("| ConfigError: no |")
