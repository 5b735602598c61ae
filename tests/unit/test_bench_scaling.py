"""``make bench-scaling``'s pure parts (benchmarks/scaling.py): the grid, and the docs' table and figure rendered
from a record alone."""

from __future__ import annotations

from benchmarks.peer import SideResult, side_record
from benchmarks.record import DOC, load_record
from benchmarks.scaling import BLOCK, CENTRE, RECORD, grid, plot, render, step_seconds


def test_the_grid_moves_one_axis_at_a_time_around_the_centre():
    sizes = grid()
    assert sizes[0] == CENTRE and len(sizes) == len(set(sizes)) == 9
    assert all(sum(a != b for a, b in zip(size, CENTRE)) == 1 for size in sizes[1:])
    assert (64, 8, 16) in sizes and (16, 16, 16) in sizes and (16, 8, 64) in sizes


def fake_record() -> dict:
    results = []
    for p, n, t in grid():
        trl, ours = SideResult(p * n * t / 1000), SideResult(p * n * t / 3000)
        results.append({"size": [p, n, t], "sides": {"TRL": side_record(trl, p * n), "mmrl": side_record(ours, p * n)}})
    return {"command": "python -m benchmarks.scaling", "commit": "0123456789abcdef", "date": "2026-12-06",
            "machine": {"cores": 2, "cpu": "Some CPU", "torch": "2.13.0+cpu"}, "work": {"steps": 3, "threads": 2},
            "results": results}


def test_the_table_has_a_row_per_size_with_its_ratio_and_the_figure_draws(tmp_path):
    record = fake_record()
    block = render(record)
    assert block.startswith(BLOCK.begin) and block.endswith(BLOCK.end)
    assert "| 64x8x16 | 8.192 | 2.731 | 62.5 | 187.5 | 3.00x |" in block
    assert step_seconds(record)[(16, 8, 64)] == {"TRL": 8.192, "mmrl": 2.7307}
    path = plot(record, tmp_path / "scaling.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_docs_table_is_the_stored_record():
    """docs/performance.md's bench-scaling table is rendered from results/bench/scaling.json and nothing else."""
    text = DOC.read_text()
    assert text.count(BLOCK.begin) == 1 and text.count(BLOCK.end) == 1
    assert BLOCK.replace(text, render(load_record(RECORD))) == text
