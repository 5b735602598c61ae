"""The peak-memory window the benchmark reads from every worker."""

import sys

import pytest
import torch

from mmrl.controller.worker import Worker, rss_mb


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs is Linux-only")
def test_peak_rss_window_sees_a_transient_allocation_and_resets():
    worker = Worker(0, 1, device="cpu")
    start = worker.reset_peak_rss()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    del block
    assert worker.peak_rss_mb() >= start + 60
    again = worker.reset_peak_rss()
    assert worker.peak_rss_mb() < again + 30 and abs(again - rss_mb()) < 30
