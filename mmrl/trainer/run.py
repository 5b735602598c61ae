"""The ``make rl`` stage: an :class:`~mmrl.trainer.rl.RLTrainer` run in its MLflow run, resumed per
``trainer.resume``."""

from __future__ import annotations

from mmrl.config import Config
from mmrl.trainer.tracking import Tracker
from mmrl.trainer.checkpoint import load_driver_state, resume_point
from mmrl.trainer.rl import CURVES, RLTrainer


def run_rl(cfg: Config, trainer_class: type[RLTrainer] = RLTrainer) -> dict[str, float]:
    """The ``make rl`` stage: train (resuming per ``trainer.resume``), log to MLflow, save
    ``<trainer.out_dir>/checkpoint``. ``trainer_class``: an RLTrainer subclass that records more (a benchmark's)."""
    resume = resume_point(cfg)
    trainer = trainer_class(cfg)
    run_id = load_driver_state(resume).mlflow_run_id if resume is not None else None
    keys = [key for keys in CURVES.values() for key in keys]
    tracker = Tracker(cfg, cfg.trainer.experiment, cfg.trainer.run_name or "rl", stage="rl", resume_run_id=run_id,
                      history_keys=keys)
    try:
        result = trainer.fit(tracker, resume)
        result["mlflow_run_id"] = tracker.run_id  # type: ignore[assignment]
        result["steps"] = trainer.step_no  # fewer than trainer.steps when it stopped early (trainer.stop_val_acc)
        tracker.finish()
        return result
    except BaseException:
        tracker.finish("FAILED")
        raise
    finally:
        trainer.close()
