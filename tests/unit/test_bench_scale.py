"""``make bench-scale``'s pure parts (benchmarks/scale.py): the docs' table rendered from a stored record alone."""

from __future__ import annotations

from benchmarks.record import DOC, load_record
from benchmarks.scale import BLOCK, RECORD, render


def fake_record() -> dict:
    results = [{"side": side, "micro": m, "length": 64, "peak_gb": peak, "step_s": [t]}
               for side, m, peak, t in (("mmrl", 8, 6.0, 2.0), ("trl", 8, 8.0, 5.0), ("mmrl", 64, 7.0, 10.0),
                                        ("trl", 64, 12.0, 30.0))]
    return {"command": "python -m benchmarks.scale", "commit": "0123456789abcdef", "date": "2026-12-06",
            "machine": {"cores": 2, "cpu": "Some CPU", "torch": "2.13.0+cpu"}, "work": {"title": "One update"},
            "state_gib": {"full": 5.0, "lora": 1.0}, "vocab": 151936, "results": results}


def test_the_table_gives_each_mmrl_side_its_ratios_to_trl():
    block = render(fake_record())
    assert block.startswith(BLOCK.begin) and block.endswith(BLOCK.end)
    assert "| 8 x 64 | mmrl | 5.00 | 6.00 | 1.00 | 2.0 | 256 | 0.75 | 2.50x |" in block
    assert "| 64 x 64 | mmrl | 5.00 | 7.00 | 2.00 | 10.0 | 410 | 0.58 | 3.00x |" in block
    assert "- mmrl: 8 -> 64 responses of 64 tokens: peak +1.00 GiB" in block


def test_the_docs_table_is_the_stored_record():
    text = DOC.read_text()
    assert text.count(BLOCK.begin) == 1 and text.count(BLOCK.end) == 1
    assert BLOCK.replace(text, render(load_record(RECORD))) == text
