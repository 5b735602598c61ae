"""Seconds per named phase inside a worker's call (the rollout's vision encoding, prefill and decode): what the
driver's stage timers cannot split."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class PhaseClock:
    """Adds each timed block's seconds to ``seconds[name]``; on a GPU it waits for the device before reading the
    time, so a block's seconds are its kernels' and not only their launches'. A block is a ``mmrl.<name>`` span in
    a profile (:mod:`mmrl.perf.profile`)."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}

    def _sync(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self._sync()
        start = time.perf_counter()
        try:
            with torch.profiler.record_function(f"mmrl.{name}"):
                yield
        finally:
            self._sync()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def take(self) -> dict[str, float]:
        """The seconds so far, and a fresh start."""
        out, self.seconds = self.seconds, {}
        return out
