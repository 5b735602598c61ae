"""``make bench-peer``'s pure parts: TRL's MFU from mmrl's FLOP account, and the docs' tables rendered from a stored
record alone (benchmarks/peer.py)."""

from __future__ import annotations

import pytest

from benchmarks.peer import BLOCK, RECORD, SideResult, mfu_rows, peer_mfu, render, side_record, speed_rows
from benchmarks.record import DOC, load_record


def test_trl_mfu_is_mmrl_s_flops_over_trl_s_seconds():
    mmrl = SideResult(1.0, {"generate": 0.4, "score+log-probs": 0.1, "update": 0.5}, tflop={"gen": 2.0,
                      "update_actor": 6.0, "old_log_prob": 1.0}, peak_tflops=10.0)
    trl = SideResult(3.0, {"generate": 0.8, "score+log-probs": 0.2, "update": 2.0})
    assert peer_mfu(trl, mmrl) == pytest.approx({"gen": 2.0 / 0.8 / 10.0, "update_actor": 6.0 / 2.0 / 10.0})
    assert peer_mfu(trl, SideResult(1.0, {}, tflop={"gen": 2.0})) == {}  # no peak measured: no MFU


def record() -> dict:
    trl = SideResult(2.0, {"generate": 0.5, "score+log-probs": 0.5, "update": 1.0}, mean_length=16.0,
                     mfu={"gen": 0.05}, peak_tflops=0.4)
    ours = SideResult(0.5, {"generate": 0.2, "score+log-probs": 0.1, "update": 0.2}, mean_length=15.0,
                      mfu={"gen": 0.125, "update_actor": 0.25}, peak_tflops=0.4)
    return {"command": "python -m benchmarks.peer --sizes 4x2x8", "commit": "0123456789abcdef", "date": "2026-12-06",
            "machine": {"cores": 2, "cpu": "Some CPU", "torch": "2.13.0+cpu"}, "work": {"steps": 3, "threads": 2},
            "results": [{"size": [4, 2, 8], "sides": {"TRL": side_record(trl, 8), "mmrl": side_record(ours, 8)}}]}


def test_the_tables_show_each_side_its_ratio_and_its_mfu():
    header, rows = speed_rows(record())
    assert rows[0][:4] == ["4x2x8", "TRL", "4.0", ""] and rows[1][:4] == ["4x2x8", "mmrl", "16.0", "4.00x"]
    header, rows = mfu_rows(record())
    assert header[3:] == ["gen", "update_actor"]
    assert rows == [["4x2x8", "TRL", "400", "5.0%", "-"], ["4x2x8", "mmrl", "400", "12.5%", "25.0%"]]
    block = render(record())
    assert block.startswith(BLOCK.begin) and block.endswith(BLOCK.end) and "`0123456`" in block


def test_the_docs_tables_are_the_stored_records():
    """docs/performance.md's bench-peer tables are rendered from results/bench/peer.json and nothing else:
    `python -m benchmarks.peer --render` after editing either."""
    text = DOC.read_text()
    assert text.count(BLOCK.begin) == 1 and text.count(BLOCK.end) == 1
    assert BLOCK.replace(text, render(load_record(RECORD))) == text
