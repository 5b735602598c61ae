"""``make bench-long-tail``'s pure parts: the response lengths' statistics, and the docs' table rendered from a stored
record alone (benchmarks/long_tail.py)."""

from __future__ import annotations

import copy
import json

import pytest

from benchmarks.long_tail import (BEGIN, END, RECORD, eos_rate, length_stats, quantile, render, replace_block, spread,
                                  table_rows)
from benchmarks.record import DOC, dump_record, load_record


def test_quantiles_interpolate_between_ranks_as_numpy_does():
    values = [float(x) for x in range(1, 11)]  # 1..10
    assert quantile(values, 0.1) == pytest.approx(1.9)
    assert quantile(values, 0.5) == pytest.approx(5.5)
    assert quantile(values, 0.9) == pytest.approx(9.1)
    assert quantile([7.0], 0.9) == 7.0
    assert quantile([3.0, 1.0, 2.0], 0.0) == 1.0  # unsorted input
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_length_stats_show_a_long_tail_and_its_spread_within_a_step():
    # nine short responses and a long one in each step: p10 is short, p90 close to the longest
    step = [8, 10, 12, 16, 20, 24, 40, 64, 128, 256]
    stats = length_stats(step)
    assert stats == {"p10": 9.8, "p50": 22.0, "p90": 140.8, "max": 256.0, "mean": 57.8}
    assert spread([step, step]) == pytest.approx(140.8 / 9.8, abs=0.01)
    # the median over the steps, not the pooled lengths' ratio
    flat = [50] * 10
    assert spread([step, flat, flat]) == 1.0


def test_the_eos_rate_counts_responses_that_ended_before_the_cap_per_token_drawn():
    assert eos_rate([10, 256, 20], 256) == pytest.approx(2 / 286)
    assert eos_rate([256, 256], 256) == 0.0


def record_of(sync_rate: float = 4.0) -> dict:
    side = {"samples": 32, "step_s": 8.0, "wait_rollout_s": None, "wait_weights_s": None, "staleness": None,
            "token_staleness": None, "inflight_token_share": None, "eos_per_token": 0.0032,
            "lengths": {"p10": 28.0, "p50": 222.0, "p90": 256.0, "max": 256.0, "mean": 179.0}, "step_spread": 9.14}
    sync = side | {"samples_per_s": sync_rate}
    async_ = side | {"samples_per_s": 6.0, "wait_rollout_s": 0.5, "wait_weights_s": 1.25, "staleness": 1.0,
                     "token_staleness": 1.0}
    partial = async_ | {"samples_per_s": 5.0, "token_staleness": 0.875, "inflight_token_share": 0.123}
    return {"command": "python -m benchmarks.long_tail --size 4x8x256", "commit": "0123456789abcdef+dirty",
            "date": "2026-01-02", "machine": {"cores": 2, "cpu": "Some CPU", "torch": "2.13.0+cpu"},
            "work": {"size": [4, 8, 256], "steps": 6}, "sides": {"mmrl": sync, "mmrl-async": async_,
                                                                   "mmrl-async-partial": partial}}


def test_the_table_gives_each_side_against_the_first_with_its_idle_times_and_lengths():
    header, rows = table_rows(record_of())
    assert header[:3] == ["side", "samples/s", "vs mmrl (sync)"]
    table = {row[0]: dict(zip(header, row)) for row in rows}
    assert list(table) == ["mmrl (sync)", "mmrl-async", "mmrl-async-partial"]
    assert table["mmrl (sync)"]["vs mmrl (sync)"] == "1.00x" and table["mmrl (sync)"]["trainer idle s"] == "-"
    assert table["mmrl-async"]["vs mmrl (sync)"] == "1.50x"
    assert (table["mmrl-async"]["trainer idle s"], table["mmrl-async"]["pool idle s"]) == ("0.50", "1.25")
    assert table["mmrl-async"]["in-flight tokens"] == "-"
    partial = table["mmrl-async-partial"]
    assert (partial["vs mmrl (sync)"], partial["token staleness"]) == ("1.25x", "0.88")
    assert partial["in-flight tokens"] == "12%"
    assert partial["eos / token"] == "1/312"
    assert partial["length p10 / p50 / p90 / max"] == "28 / 222 / 256 / 256"
    assert partial["p90/p10 in a step"] == "9.1"
    # the ratio follows the stored numbers
    assert dict(zip(header, table_rows(record_of(sync_rate=3.0))[1][1]))["vs mmrl (sync)"] == "2.00x"


def test_the_docs_block_comes_from_the_record_and_replaces_only_its_own_lines():
    record = record_of()
    block = render(record)
    assert block.startswith(BEGIN) and block.endswith(END)
    assert "`python -m benchmarks.long_tail --size 4x8x256`" in block and "`0123456+dirty`" in block
    assert "| mmrl-async | 6.00 | 1.50x |" in block
    doc = f"# Title\n\nbefore\n\n{BEGIN}\nold table\n{END}\n\nafter\n"
    new = replace_block(doc, block)
    assert new == f"# Title\n\nbefore\n\n{block}\n\nafter\n"
    assert replace_block(new, block) == new  # rendering again changes nothing
    changed = copy.deepcopy(record)
    changed["sides"]["mmrl-async"]["samples_per_s"] = 7.0
    assert replace_block(new, render(changed)) != new
    with pytest.raises(ValueError):
        replace_block("# no markers\n", block)


def test_a_record_dumps_with_its_number_lists_on_one_line_and_loads_back():
    record = record_of() | {"extra": {"step_lengths": [[28.0, 222.0, 256.0, 256.0], [30.5, 200.0, 256.0, 256.0]],
                                      "overrides": ["data.sizes={sft: 8, train: 4}"]}}
    text = dump_record(record)
    assert json.loads(text) == record
    assert "[28.0, 222.0, 256.0, 256.0]" in text


def test_the_docs_table_is_the_stored_records():
    """docs/performance.md's long-tail table is rendered from results/bench/long_tail.json and nothing else:
    `python -m benchmarks.long_tail --render` after editing either."""
    text = DOC.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert replace_block(text, render(load_record(RECORD))) == text
