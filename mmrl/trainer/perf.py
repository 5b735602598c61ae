"""The trainer's performance record: the MFU account (each step's phase FLOPs, :mod:`mmrl.perf.flops`, from its
batch, over the phases' seconds, against the actor group's peak measured when the run starts, :mod:`mmrl.perf.mfu`)
and the profiles of ``trainer.profile_steps``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from transformers import AutoConfig

from mmrl.config import Config
from mmrl.controller import WorkerGroup
from mmrl.perf.flops import groups_of, phase_flops
from mmrl.perf.mfu import group_peak, mfu_metrics, peak_metrics
from mmrl.perf.peak import Peak
from mmrl.protocol import Batch
from mmrl.trainer.tracking import Tracker
from mmrl.trajectory import policy_mask


class MFUAccount:
    """``perf/mfu/<phase>`` of a run's steps; :meth:`measure` once its workers exist."""

    def __init__(self, cfg: Config, checkpoint: str) -> None:
        self.cfg = cfg
        self.model_config = AutoConfig.from_pretrained(checkpoint)
        self.peak: Peak | None = None

    def measure(self, workers: WorkerGroup) -> dict[str, float]:
        """Every rank of ``workers`` measures its matmul peak at once, in the run's dtype and threads; returns
        the peak metrics (:func:`~mmrl.perf.mfu.peak_metrics`)."""
        text = getattr(self.model_config, "text_config", self.model_config)
        self.peak = group_peak(workers.measure_peak(text.hidden_size, text.intermediate_size, self.cfg.model.dtype))
        return peak_metrics(self.peak)

    def metrics(self, batch: Batch, seconds: Mapping[str, float]) -> dict[str, float]:
        """``perf/mfu/<phase>`` and ``perf/tflop/<phase>`` of a step: batch holds uid, prompt_tokens (B,),
        response_mask (B, R), vision_grids (or image_grids), and for agent episodes num_turns (B,) and
        tool_grids; ``seconds`` the step's timing."""
        if self.peak is None or "uid" not in batch.objects:
            return {}
        grids = next((batch[key] for key in ("vision_grids", "image_grids") if key in batch.objects),
                     [[]] * len(batch))
        turns = batch["num_turns"] if "num_turns" in batch.tensors else None
        tools = batch["tool_grids"] if "tool_grids" in batch.objects else None
        groups = groups_of(batch["uid"], batch["prompt_tokens"], batch["response_mask"], policy_mask(batch), grids,
                           turns, tools)
        actor = self.cfg.actor
        lora = actor.lora.rank > 0
        flops = phase_flops(self.model_config, groups, epochs=actor.ppo_epochs, lora=lora,
                            vision_trains=not actor.vision.freeze and (not lora or actor.lora.include_vision))
        return mfu_metrics(flops, seconds, self.peak)


def phase_shares(seconds: Mapping[str, float], metrics: Mapping[str, float]) -> str:
    """A step's phases as a table: seconds, share of the step, and MFU where the account has it. The ``gen/*``
    parts are inside ``gen``; the step's other stages (reward, advantages, weight syncs) fill the rest."""
    step = seconds.get("step", 0.0) or 1.0
    lines = [f"{'phase':<16}{'seconds':>10}{'share':>9}{'MFU':>9}"]
    for name, took in sorted(seconds.items(), key=lambda kv: -kv[1]):
        mfu = metrics.get(f"perf/mfu/{name}")
        lines.append(f"{name:<16}{took:>10.3f}{took / step:>9.1%}{'' if mfu is None else f'{mfu:>9.2%}'}")
    return "\n".join(lines) + "\n"


def save_profile(workers: WorkerGroup, tracker: Tracker, folder: Path, seconds: Mapping[str, float],
                 metrics: Mapping[str, float]) -> None:
    """The profiles the ranks of ``workers`` recorded since ``start_profile`` (each rank's trace and top operators)
    and the step's phase shares, into ``folder`` and as the run's artifacts under ``profile/<folder's name>``."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank, (trace, table) in enumerate(workers.stop_profile()):
        (folder / f"trace_rank{rank}.json.gz").write_bytes(trace)
        (folder / f"ops_rank{rank}.txt").write_text(table)
    (folder / "phases.txt").write_text(phase_shares(seconds, metrics))
    tracker.log_artifacts(folder, f"profile/{folder.name}")
