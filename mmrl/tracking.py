"""Experiment tracking: MLflow (a local sqlite store by default) and one console line per step.

Metric names follow one vocabulary, close to verl's: ``timing_s/<stage>``, ``perf/throughput``,
``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/entropy``, ``actor/grad_norm``,
``critic/score/mean``, ``response_length/mean``, ``val/<data_source>/acc``, ``reward/num_errors``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import mlflow

from mmrl.config import Config, TrackingConfig, flatten, to_dict

log = logging.getLogger(__name__)


def tracking_uri(cfg: TrackingConfig) -> str:
    """``tracking.uri``, else $MLFLOW_TRACKING_URI, else a sqlite file under outputs/."""
    if cfg.uri:
        return cfg.uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    path = Path(cfg.sqlite_path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def ensure_experiment(name: str, uri: str, cfg: TrackingConfig) -> None:
    """Select experiment ``name``, creating it; a local sqlite store keeps artifacts under outputs/ too."""
    if mlflow.get_experiment_by_name(name) is None:
        location = None
        if uri.startswith("sqlite:"):
            location = Path(cfg.artifact_dir).absolute().as_uri()
        mlflow.create_experiment(name, artifact_location=location)
    mlflow.set_experiment(name)


class Tracker:
    """One MLflow run: params from the resolved config, metrics per step, artifacts."""

    def __init__(self, cfg: Config, experiment: str, run_name: str, stage: str) -> None:
        self.uri = tracking_uri(cfg.tracking)
        mlflow.set_tracking_uri(self.uri)
        ensure_experiment(experiment, self.uri, cfg.tracking)
        self.run = mlflow.start_run(run_name=run_name or None, tags={"mmrl.stage": stage})
        self.run_id = self.run.info.run_id
        self.history: dict[str, list[tuple[int, float]]] = {}
        params = {k: _param_value(v) for k, v in flatten(to_dict(cfg)).items()}
        items = list(params.items())
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per call
            mlflow.log_params(dict(items[start : start + 100]))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        finite = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        for key, value in finite.items():
            self.history.setdefault(key, []).append((step, value))
        mlflow.log_metrics(finite, step=step)

    def log_dict(self, data: Any, artifact_file: str) -> None:
        mlflow.log_dict(data, artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        mlflow.log_text(text, artifact_file)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        mlflow.log_figure(figure, artifact_file)

    def finish(self, status: str = "FINISHED") -> None:
        mlflow.end_run(status=status)


def _param_value(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text[:500]


def console_line(step: int, total: int, metrics: dict[str, float], labels: dict[str, str]) -> str:
    """``step 12/100 | score 0.62 | val_acc 0.7 | ...``: the metrics named in ``labels`` (key -> label)."""
    parts = [f"step {step}/{total}"]
    parts += [f"{label} {metrics[key]:.4g}" for key, label in labels.items() if key in metrics]
    return " | ".join(parts)

