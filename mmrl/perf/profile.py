"""A rank's torch profile of chosen steps (``trainer.profile_steps``): its Chrome trace and its top operators.

Each rank records what it runs between :meth:`RankProfile.start` and :meth:`RankProfile.stop` (the worker
methods show as ``mmrl.<method>`` spans, the rollout's phases as ``mmrl.vision``, ``mmrl.prefill``,
``mmrl.decode``) and hands back the trace gzipped, so a driver on another node gets it too.
"""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

TOP_OPS = 40
"""Rows of the top-operators table."""


class RankProfile:
    """One rank's profiler for one step at a time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.profiler: profile | None = None

    def start(self) -> None:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self.profiler = profile(activities=activities, record_shapes=True)
        self.profiler.start()

    def stop(self) -> tuple[bytes, str]:
        """The gzipped Chrome trace and the table of the operators that took the most time of their own."""
        if self.profiler is None:
            raise RuntimeError("stop_profile without start_profile")
        prof, self.profiler = self.profiler, None
        prof.stop()
        sort = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = prof.key_averages(group_by_input_shape=True).table(sort_by=sort, row_limit=TOP_OPS, max_name_column_width=60)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            return gzip.compress(path.read_bytes()), table
