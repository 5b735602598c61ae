"""Metric names MLflow accepts, URIs without credentials, the model path checked before Ray."""

import pytest
import ray

from mmrl.trainer.tracking import MAX_METRIC_NAME, metric_name, redact_uri
from mmrl.trainer.rl import RLTrainer


@pytest.mark.parametrize("key,expected", [
    ("val/synthetic/colour/acc", "val/synthetic/colour/acc"),
    ("val/my data (v2)/acc", "val/my data _v2_/acc"),
    ("val/../etc/acc", "val/_/etc/acc"),
    ("val//acc", "val/_/acc"),
    ("reward/a+b=c?/mean", "reward/a_b_c_/mean"),
    ("val/ünïcode:ok/acc", "val/ünïcode:ok/acc"),
    ("/abs/", "_/abs/_"),
])
def test_metric_names_are_made_acceptable_to_mlflow(key, expected):
    from mlflow.utils.validation import _validate_metric_name

    assert metric_name(key) == expected
    _validate_metric_name(metric_name(key))  # raises if MLflow would refuse it


def test_a_long_metric_name_is_cut_to_mlflow_s_limit():
    assert len(metric_name("val/" + "x" * 400 + "/acc")) == MAX_METRIC_NAME


@pytest.mark.parametrize("uri,expected", [
    ("https://alice:s3cret@mlflow.example.com/api", "https://***@mlflow.example.com/api"),
    ("postgresql://user:pw@db:5432/mlflow", "postgresql://***@db:5432/mlflow"),
    ("sqlite:////work/outputs/mlflow.db", "sqlite:////work/outputs/mlflow.db"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
])
def test_uris_lose_their_credentials(uri, expected):
    assert redact_uri(uri) == expected


def test_a_missing_init_checkpoint_fails_before_ray_starts(tiny_config, tmp_path):
    tiny_config.trainer.init = str(tmp_path / "no-such-checkpoint")
    ray_was_up = ray.is_initialized()  # the integration tests' session may be up when all tests run together
    with pytest.raises(FileNotFoundError, match="trainer.init checkpoint .*no-such-checkpoint has no config.json"):
        RLTrainer(tiny_config)
    assert ray.is_initialized() == ray_was_up


def test_a_hostile_data_source_reaches_mlflow_as_a_valid_name(tiny_config):
    from mlflow.tracking import MlflowClient

    from mmrl.trainer.tracking import Tracker

    tracker = Tracker(tiny_config, "names", "run", stage="eval")
    tracker.log_metrics({"val/my data (v2)/../x/acc": 0.5, "reward/a+b/mean": 1.0}, step=1)
    tracker.finish()
    metrics = MlflowClient(tiny_config.tracking.uri).get_run(tracker.run_id).data.metrics
    assert metrics == {"val/my data _v2_/_/x/acc": 0.5, "reward/a_b/mean": 1.0}


def test_a_resumed_tracker_continues_the_same_run_and_reads_its_history(tiny_config):
    from mmrl.trainer.tracking import Tracker

    first = Tracker(tiny_config, "resume", "run", stage="rl")
    first.log_metrics({"critic/score/mean": 0.25}, step=1)
    first.log_metrics({"critic/score/mean": 0.5}, step=2)
    first.finish()
    tiny_config.trainer.steps += 10  # a changed param must not clash with the logged one
    second = Tracker(tiny_config, "resume", "run", stage="rl", resume_run_id=first.run_id,
                     history_keys=["critic/score/mean", "val/acc"])
    assert second.run_id == first.run_id
    assert second.history == {"critic/score/mean": [(1, 0.25), (2, 0.5)]}
    second.finish()
