"""Resumable checkpoints of an RL run: where they live, how they are written, which one a run resumes.

::

    <trainer.out_dir>/
        step_<N>/               one complete checkpoint (written as step_<N>.tmp/, renamed when complete)
            actor/              the actor group's training state (mmrl.workers.train_state)
            critic/             the critic group's, when the algorithm has a critic
            driver.pt           the step, the prompt loader's position and RNG, the MLflow run id
            meta.json           the same facts in readable form, and the layout it was saved with
        latest                  the name of the newest complete checkpoint
        checkpoint/             the Hugging Face export of the final policy (not a resume point); with LoRA
                                the merged weights, and the adapters in peft's format in checkpoint/adapter/

The reference policy is not saved: a resumed run rebuilds it from ``trainer.init``, so the KL anchor
stays the original policy. Nor are frozen weights (:mod:`mmrl.workers.train_state`): a LoRA run's checkpoint
holds its adapters and their optimizer state, and resumes only over the same ``trainer.init`` and LoRA rank.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mmrl.config import Config

STEP_DIR = re.compile(r"^step_(\d+)$")
LATEST = "latest"


@dataclass
class DriverState:
    """What the driver itself holds across a resume."""

    step: int
    mlflow_run_id: str
    loader: dict[str, Any]
    skipped_in_a_row: int = 0
    kl_coef: float | None = None  # the adaptive KL controller's coefficient (KL in the reward)
    pass_rates: dict[str, Any] | None = None  # the per-prompt record the sampling rules read
    stopped_at: float | None = None  # the val/acc at which the run stopped early (trainer.stop_val_acc)


def resume_note(folder: Path, step: int, steps: int, stopped: bool) -> str:
    """The line a resume prints: where it starts and what is left to train."""
    left = ("stopped early" if stopped else f"{steps - step} steps to go") if step < steps else (
        f"nothing left to train (trainer.steps={steps}); use trainer.resume=never or another out_dir "
        "for a fresh run")
    return f"resumed from {folder} at step {step}: {left}"


def is_complete(folder: Path) -> bool:
    return folder.is_dir() and (folder / "meta.json").is_file() and (folder / "driver.pt").is_file()


class CheckpointManager:
    """Writes ``step_<N>`` folders under ``out_dir`` atomically and keeps the newest ``keep_last``."""

    def __init__(self, out_dir: str | Path, keep_last: int) -> None:
        self.out_dir, self.keep_last = Path(out_dir), keep_last

    def path(self, step: int) -> Path:
        return self.out_dir / f"step_{step}"

    def begin(self, step: int) -> Path:
        """A fresh temporary folder for step ``step``'s checkpoint (workers write into its subfolders)."""
        tmp = self.out_dir / f"step_{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, state: DriverState, meta: dict[str, Any]) -> Path:
        """Finish a checkpoint: the driver's state, then the rename, the ``latest`` marker and pruning."""
        torch.save(asdict(state), tmp / "driver.pt")
        readable = {"step": state.step, "mlflow_run_id": state.mlflow_run_id, **meta,
                    "saved_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        (tmp / "meta.json").write_text(json.dumps(readable, indent=2))
        final = self.path(state.step)
        if final.exists():  # the same step saved again after a restart
            shutil.rmtree(final)
        os.replace(tmp, final)
        marker = self.out_dir / f"{LATEST}.tmp"
        marker.write_text(final.name)
        os.replace(marker, self.out_dir / LATEST)
        self.prune()
        return final

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.out_dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.out_dir.iterdir() if (m := STEP_DIR.match(p.name))]
        return [p for _, p in sorted(found) if is_complete(p)]

    def latest(self) -> Path | None:
        """The newest complete checkpoint: the ``latest`` marker's, else the highest complete step."""
        marker = self.out_dir / LATEST
        if marker.is_file():
            named = self.out_dir / marker.read_text().strip()
            if is_complete(named):
                return named
        done = self.complete()
        return done[-1] if done else None

    def prune(self) -> None:
        for old in self.complete()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def resume_point(cfg: Config) -> Path | None:
    """The checkpoint ``trainer.resume`` asks for: ``auto`` (the newest in out_dir, if any), ``never``, or a path."""
    choice = cfg.trainer.resume
    if choice == "never":
        return None
    if choice == "auto":
        return CheckpointManager(cfg.trainer.out_dir, cfg.trainer.keep_last).latest()
    path = Path(choice)
    if not is_complete(path):
        raise FileNotFoundError(
            f"trainer.resume={choice} is not a complete checkpoint folder (a step_<N> folder holding meta.json and "
            "driver.pt); use auto, never, or such a folder"
        )
    return path


def check_resumable(folder: Path, cfg: Config, init: str) -> None:
    """Raise ValueError when ``folder``'s LoRA adapters do not fit the run: another ``actor.lora.rank``, or
    adapters saved over another base checkpoint than ``init``."""
    meta = json.loads((folder / "meta.json").read_text())
    saved, rank = meta.get("lora_rank", 0), cfg.actor.lora.rank
    if saved != rank:
        raise ValueError(f"{folder} was saved with actor.lora.rank={saved}, this run has actor.lora.rank={rank}: "
                         "resume with the rank it was saved with, or trainer.resume=never")
    if rank and Path(meta["init"]).resolve() != Path(init).resolve():
        raise ValueError(f"{folder} holds LoRA adapters over {meta['init']}, not over trainer.init={init}: set "
                         f"trainer.init={meta['init']}, or trainer.resume=never")


def load_driver_state(folder: Path) -> DriverState:
    return DriverState(**torch.load(folder / "driver.pt", weights_only=False))
