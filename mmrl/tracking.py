"""Experiment tracking: MLflow (a local sqlite store by default) and one console line per step.

Metric names follow one vocabulary, close to verl's: ``timing_s/<stage>``, ``perf/throughput``,
``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/entropy``, ``actor/grad_norm``,
``critic/score/mean``, ``response_length/mean``, ``val/<data_source>/acc``, ``reward/<name>/failures``.
Names built from data (a ``data_source``, a reward component) pass :func:`metric_name`, which turns them
into names MLflow accepts. URIs with credentials are logged without them (:func:`redact_uri`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import mlflow
from mlflow.tracking import MlflowClient

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


_UNSAFE = re.compile(r"[^\w./\- :]")
MAX_METRIC_NAME = 250


def metric_name(key: str) -> str:
    """``key`` as a name MLflow accepts: characters other than letters, digits, ``_ - . : /`` and spaces
    become ``_``; empty, ``.`` and ``..`` path segments become ``_``; at most 250 characters."""
    parts = [_UNSAFE.sub("_", part) for part in key.split("/")]
    parts = ["_" if part in ("", ".", "..") else part for part in parts]
    return "/".join(parts)[:MAX_METRIC_NAME]


def redact_uri(uri: str) -> str:
    """``uri`` without a user name or password (``https://u:p@host/x`` -> ``https://***@host/x``)."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


class Tracker:
    """One MLflow run: params from the resolved config, metrics per step, artifacts.

    With ``resume_run_id`` the run continues (a resumed training run): params are not logged again, and
    the history of ``history_keys`` is read back so that the curves cover the whole run.
    """

    def __init__(self, cfg: Config, experiment: str, run_name: str, stage: str, resume_run_id: str | None = None,
                 history_keys: Sequence[str] = ()) -> None:
        self.uri = tracking_uri(cfg.tracking)
        mlflow.set_tracking_uri(self.uri)
        ensure_experiment(experiment, self.uri, cfg.tracking)
        self.history: dict[str, list[tuple[int, float]]] = {}
        self.resumed = bool(resume_run_id and _run_exists(resume_run_id))
        if self.resumed:
            self.run = mlflow.start_run(run_id=resume_run_id)
            self.run_id = self.run.info.run_id
            self._read_history(history_keys)
            return
        if resume_run_id:
            log.warning("MLflow run %s is not in %s: the resumed training logs to a new run", resume_run_id,
                        redact_uri(self.uri))
        self.run = mlflow.start_run(run_name=run_name or None, tags={"mmrl.stage": stage})
        self.run_id = self.run.info.run_id
        params = {k: _param_value(v) for k, v in flatten(to_dict(cfg)).items()}
        items = list(params.items())
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per call
            mlflow.log_params(dict(items[start : start + 100]))

    def log_params(self, params: dict[str, str]) -> None:
        """More params beside the config's; a resumed run keeps the ones its first part logged (MLflow's params
        cannot change)."""
        if not self.resumed:
            mlflow.log_params({k: _param_value(v) for k, v in params.items()})

    def _read_history(self, keys: Sequence[str]) -> None:
        client = MlflowClient(self.uri)
        for key in keys:
            points = client.get_metric_history(self.run_id, metric_name(key))
            if points:
                self.history[key] = [(p.step, p.value) for p in sorted(points, key=lambda p: (p.step, p.timestamp))]

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        finite = {metric_name(k): float(v) for k, v in metrics.items()
                  if isinstance(v, (int, float)) and math.isfinite(v)}
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


def _run_exists(run_id: str) -> bool:
    try:
        mlflow.get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return False
    return True


def _param_value(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    if "://" in text:
        text = redact_uri(text)
    return text[:500]


def console_line(step: int, total: int, metrics: dict[str, float], labels: dict[str, str]) -> str:
    """``step 12/100 | score 0.62 | val_acc 0.7 | ...``: the metrics named in ``labels`` (key -> label)."""
    parts = [f"step {step}/{total}"]
    parts += [f"{label} {metrics[key]:.4g}" for key, label in labels.items() if key in metrics]
    return " | ".join(parts)

