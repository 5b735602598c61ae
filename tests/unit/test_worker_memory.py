"""The peak-memory window of a worker (``perf/max_memory_gb``, :mod:`mmrl.memory.peaks`)."""

import sys

import pytest
import torch

from mmrl.controller.worker import Worker
from mmrl.memory.peaks import GIB, live_gb, peak_gb, reset_peak

MIB = 2**20 / GIB  # one MiB in GiB
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs is Linux-only")
@pytest.mark.parametrize("kind", DEVICES)
def test_the_window_sees_an_allocation_and_a_reset_forgets_it(kind):
    """A step's window (no trim): a 200 MiB tensor, touched, raises the peak by about 200 MiB; freed and reset,
    the peak falls back to the live memory."""
    device = torch.device(kind)
    start = reset_peak(device)
    assert peak_gb(device) < start + 30 * MIB
    block = torch.ones(200 * 2**20 // 4, device=device)  # written: every page resident
    assert peak_gb(device) >= start + 190 * MIB
    del block
    high = peak_gb(device)
    again = reset_peak(device)
    assert peak_gb(device) < again + 30 * MIB and peak_gb(device) < high - 150 * MIB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs is Linux-only")
def test_the_benchmark_window_starts_from_the_live_memory():
    worker = Worker(0, 1, device="cpu")
    start = worker.reset_peak_memory()
    assert abs(start - live_gb(worker.device)) < 30 * MIB
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    del block
    assert worker.peak_memory_gb() >= start + 60 * MIB
    (key, peak), = worker.memory_metrics("actor").items()  # one rank: its own peak
    assert key == "perf/max_memory_gb/actor" and peak == pytest.approx(worker.peak_memory_gb(), abs=5 * MIB)
