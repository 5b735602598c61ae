"""Experiment tracking: MLflow (a local sqlite store by default) and one console line per step.

Metric names follow one vocabulary, close to verl's: ``timing_s/<stage>``, ``perf/throughput``,
``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/entropy``, ``actor/grad_norm``,
``critic/score/mean``, ``response_length/mean``, ``val/<data_source>/acc``, ``reward/<name>/failures``.
Names built from data (a ``data_source``, a reward component) pass :func:`metric_name`, which turns them
into names MLflow accepts. URIs with credentials are logged without them (:func:`redact_uri`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import subprocess
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import mlflow
import mlflow.data.dataset
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


EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
"""MLflow 3's experiment kind for model training (without it the UI files the runs under GenAI evaluation)."""


def ensure_experiment(name: str, uri: str, cfg: TrackingConfig) -> None:
    """Select experiment ``name``, creating it as a training experiment; a local sqlite store keeps artifacts under
    outputs/ too. An existing experiment without a kind gets the training kind."""
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is None:
        location = None
        if uri.startswith("sqlite:"):
            location = Path(cfg.artifact_dir).absolute().as_uri()
        mlflow.create_experiment(name, artifact_location=location, tags=EXPERIMENT_KIND)
    elif "mlflow.experimentKind" not in experiment.tags:
        MlflowClient(uri).set_experiment_tag(experiment.experiment_id, *next(iter(EXPERIMENT_KIND.items())))
    mlflow.set_experiment(name)


def run_tags(cfg: Config, stage: str) -> dict[str, str]:
    """The tags a user filters runs by: stage, git commit, algorithm, model family, engine, mode, LoRA."""
    return {"mmrl.stage": stage, "mmrl.git_commit": git_commit(), "mmrl.algorithm": cfg.algorithm.name,
            "mmrl.model_family": cfg.model.family, "mmrl.engine": cfg.rollout.engine, "mmrl.mode": cfg.trainer.mode,
            "mmrl.lora": str(cfg.actor.lora.rank > 0).lower(), "mmrl.agent": str(cfg.rollout.agent.enabled).lower()}


def git_commit() -> str:
    """The commit of the mmrl checkout that runs (``+dirty`` with uncommitted changes), or ``unknown``."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


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
        system = cfg.tracking.system_metrics
        if system:
            mlflow.set_system_metrics_sampling_interval(cfg.tracking.system_metrics_interval_s)
            mlflow.set_system_metrics_samples_before_logging(1)
        if self.resumed:
            self.run = mlflow.start_run(run_id=resume_run_id, log_system_metrics=system)
            self.run_id = self.run.info.run_id
            self._read_history(history_keys)
            return
        if resume_run_id:
            log.warning("MLflow run %s is not in %s: the resumed training logs to a new run", resume_run_id,
                        redact_uri(self.uri))
        self.run = mlflow.start_run(run_name=run_name or None, tags=run_tags(cfg, stage), log_system_metrics=system)
        self.run_id = self.run.info.run_id
        params = {k: _param_value(v) for k, v in flatten(to_dict(cfg)).items()}
        items = list(params.items())
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per call
            mlflow.log_params(dict(items[start : start + 100]))
        if stage in ("sft", "rl", "eval"):
            log_splits(Path(cfg.data.dir))

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

    def log_artifacts(self, folder: Path, artifact_path: str) -> None:
        """The files of ``folder`` as the run's artifacts under ``artifact_path``."""
        mlflow.log_artifacts(str(folder), artifact_path)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        mlflow.log_figure(figure, artifact_file)

    def log_table(self, data: dict[str, list[Any]], artifact_file: str) -> None:
        """A table artifact (columns of equal length) the UI shows as a table."""
        mlflow.log_table(data, artifact_file)

    def log_model(self, checkpoint: str, register_as: str = "") -> None:
        """The Hugging Face folder ``checkpoint`` as the run's ``policy`` MLflow model (:mod:`mmrl.trainer.policy_model`)."""
        from mmrl.trainer.policy_model import log_policy

        log_policy(checkpoint, register_as)

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



SPLIT_CONTEXTS = {"sft": "training", "train": "training", "val": "validation", "test": "testing"}


def log_splits(data_dir: Path) -> None:
    """Each split parquet of ``data_dir`` as a dataset input of the active run (context training, validation or
    testing), its profile giving the rows and the quarantined rows by kind (``<split>.quarantine.jsonl``)."""
    for split, context in SPLIT_CONTEXTS.items():
        path = data_dir / f"{split}.parquet"
        if path.is_file():
            mlflow.log_input(SplitDataset(path, split), context=context, tags={"mmrl.split": split})


class SplitDataset(mlflow.data.dataset.Dataset):
    """One split's parquet file as an MLflow dataset: its path, a digest of its bytes, its row counts."""

    def __init__(self, path: Path, split: str) -> None:
        import pyarrow.parquet as pq
        from mlflow.data.dataset_source_registry import resolve_dataset_source

        self.path, self.rows = path.absolute(), pq.ParquetFile(path).metadata.num_rows
        self.quarantined = _quarantine_kinds(path.with_name(f"{split}.quarantine.jsonl"))
        with warnings.catch_warnings():  # two registered sources read local files; either serves
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(str(self.path))
        super().__init__(source=source, name=split)

    def _compute_digest(self) -> str:
        digest = hashlib.sha256()
        with self.path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()[:16]

    @property
    def profile(self) -> dict[str, Any]:
        return {"num_rows": self.rows, "num_quarantined": sum(self.quarantined.values()),
                "quarantined_by_kind": dict(self.quarantined), "path": str(self.path)}

    @property
    def schema(self) -> None:
        return None

    def to_dict(self) -> dict[str, str]:
        return super().to_dict() | {"profile": json.dumps(self.profile)}


def _quarantine_kinds(path: Path) -> Counter[str]:
    kinds: Counter[str] = Counter()
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                kinds[json.loads(line).get("kind", "unknown")] += 1
    return kinds
