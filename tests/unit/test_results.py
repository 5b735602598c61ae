"""make results: the records under results/ render docs/results.md; the demo's bar check; the matrix file."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from mmrl.config import BarConfig
from pipelines import results
from pipelines.demo import check_bar


def record(entry: str, seed: int, sft: float, rl: float, passed: bool, group: str = "", args=()) -> dict:
    return {"entry": entry, "title": entry, "group": group, "seed": seed, "commit": "0123456789abcdef",
            "config": "configs/demo.yaml", "args": list(args), "returncode": 0 if passed else 1,
            "wall_minutes": 4.5, "rl_minutes": 3.25, "sft_acc": sft, "rl_acc": rl, "gain": round(rl - sft, 4),
            "bar": {"text": "rl_acc>=0.95", "passed": passed},
            "machine": {"cores": 2, "cpu": "Test CPU"}, "config_sha256": "0", "curves": {"val_acc": [[50, 0.5], [100, rl]]}}


def test_the_committed_results_page_is_what_the_records_render():
    """docs/results.md is rendered from results/*/seed*.json; editing either alone fails this test."""
    matrix = results.load_matrix()
    expected = results.page(results.load_records(), matrix)
    assert results.DOC.read_text() == expected, "run `python -m pipelines.results --render` and commit the page"


def test_the_committed_results_page_changes_when_a_record_does():
    records = results.load_records()
    assert records, "results/ holds no records"
    changed = copy.deepcopy(records)
    changed[0]["rl_acc"] = 0.123456
    assert results.page(changed, results.load_matrix()) != results.DOC.read_text()


def test_an_entry_table_shows_each_seed_and_counts_the_bar():
    runs = [record("demo", 0, 0.305, 1.0, True), record("demo", 1, 0.142, 0.652, False)]
    page = results.render(runs, {"demo": {"config": "configs/demo.yaml"}})
    assert "| 0 | 0.305 | 1.000 | +0.695 | 3.25 | 4.5 | yes | `0123456` | 2 cores, Test CPU |" in page
    assert "| 1 | 0.142 | 0.652 | +0.510 | 3.25 | 4.5 | **no** |" in page
    assert "Bar (rl_acc>=0.95): met on 1 of 2 seeds." in page


def test_the_machine_column_gives_the_matmul_speed_a_run_started_on():
    fast = record("demo", 0, 0.3, 1.0, True)
    fast["machine"] = results.machine(matmul_gflops=95.5)
    page = results.render([fast], {"demo": {"config": "configs/demo.yaml"}})
    assert f"| `0123456` | {fast['machine']['cores']} cores, {fast['machine']['cpu']}, 95.5 GFLOP/s |" in page


def test_a_group_shows_its_variants_side_by_side():
    runs = [record("plain", 0, 0.3, 0.65, False, "levers"), record("plain", 4, 0.3, 0.97, True, "levers"),
            record("guided", 0, 0.3, 1.0, True, "levers", ["trainer.guide_unsolved=true"])]
    page = results.render(runs, {})
    assert "| plain | (the config as shipped) | 0.650 | 0.970 | 1 of 2 |" in page
    assert "| guided | `trainer.guide_unsolved=true` | 1.000 |  | 1 of 1 |" in page


def test_a_failed_run_is_a_row_too():
    failed = {**record("demo", 2, 0.0, 0.0, False), "returncode": 137, "error": "Killed"}
    for key in ("sft_acc", "rl_acc", "gain", "bar", "rl_minutes"):
        failed.pop(key)
    page = results.render([failed], {})
    assert "| 2 | - | - | - | - | 4.5 | failed (exit 137) |" in page


def test_records_load_by_entry_then_seed(tmp_path: Path):
    for entry, seed in (("b", 1), ("a", 2), ("a", 0)):
        (tmp_path / entry).mkdir(exist_ok=True)
        (tmp_path / entry / f"seed{seed}.json").write_text(json.dumps(record(entry, seed, 0.1, 0.2, False)))
    assert [(r["entry"], r["seed"]) for r in results.load_records(tmp_path)] == [("a", 0), ("a", 2), ("b", 1)]


def test_select_runs_the_part_asked_for_and_names_the_entries_on_a_typo():
    matrix = {"demo": {"seeds": [0, 1, 2]}, "ppo": {"seeds": [0]}}
    assert results.select(matrix, None, None) == [("demo", 0), ("demo", 1), ("demo", 2), ("ppo", 0)]
    assert results.select(matrix, "ppo", "3,4") == [("ppo", 3), ("ppo", 4)]
    with pytest.raises(ValueError, match="its entries: demo, ppo"):
        results.select(matrix, "dmeo", None)


def test_the_matrix_refuses_unknown_keys_and_missing_configs(tmp_path: Path):
    bad = tmp_path / "m.yaml"
    bad.write_text("demo: {config: configs/demo.yaml, seed: [0]}\n")
    with pytest.raises(ValueError, match="unknown keys \\['seed'\\]"):
        results.load_matrix(bad)
    bad.write_text("demo: {config: configs/nope.yaml}\n")
    with pytest.raises(ValueError, match="needs `config:`"):
        results.load_matrix(bad)
    for name, entry in results.load_matrix().items():  # the shipped matrix loads, every config exists
        assert (results.ROOT / entry["config"]).is_file(), name


def summary(sft: float, rl: float, rl_s: float) -> dict:
    return {"sft_acc": sft, "rl_acc": rl, "stage_seconds": {"rl": rl_s}}


def test_the_demo_bar_passes_only_when_every_set_bar_is_met():
    bar = BarConfig(rl_acc=0.95, gain=0.3, rl_minutes=4.0)
    assert check_bar(bar, summary(0.3, 0.96, 200))["passed"]
    missed = check_bar(bar, summary(0.7, 0.96, 300))  # gain 0.26, 5 minutes
    assert not missed["passed"]
    assert missed["failures"] == ["gain>=+0.30 (got 0.260)", "rl_minutes<=4.0 (got 5.000)"]
    assert not check_bar(bar, summary(0.3, 0.949, 200))["passed"]
    unset = check_bar(BarConfig(), summary(0.9, 0.1, 1e6))  # no bar set: nothing to miss
    assert unset["passed"] and unset["text"] == "none set"


def test_every_entry_of_the_matrix_loads_as_a_run_config():
    """A misspelt key in an entry's args fails here, not minutes into `make results`."""
    from mmrl.run_config import load_run_config

    for name, entry in results.load_matrix().items():
        cfg = load_run_config(results.ROOT / entry["config"], [f"seed={entry['seeds'][0]}", *entry["args"]])
        assert cfg.seed == entry["seeds"][0], name


def test_repeats_compare_runs_of_one_config_hash_and_seed():
    a, b = record("demo", 0, 0.3, 1.0, True), record("demo-repeat", 0, 0.3, 1.0, True)
    c = record("demo", 1, 0.1, 0.9, False)
    for r in (a, b, c):
        r["config_sha256"] = "abc"
    lines = results.repeats([a, b, c])
    assert "| `abc` | 0 | demo, demo-repeat | 0.300 / 0.300 | 1.000 / 1.000 | identical | 2 cores, Test CPU |" in lines
    b["curves"] = {"val_acc": [[50, 0.5], [100, 0.9]]}
    b["rl_acc"] = 0.9
    assert ("| `abc` | 0 | demo, demo-repeat | 0.300 / 0.300 | 1.000 / 0.900 | **apart from step 100** | "
            "2 cores, Test CPU |") in results.repeats([a, b, c])
    assert not any("| 1 |" in line for line in results.repeats([a, b, c]))  # one run of seed 1: nothing to compare


def test_the_first_difference_of_curves_is_the_earliest_step_any_curve_disagrees():
    base = {"score": [[1, 0.3], [2, 0.4], [3, 0.5]], "val_acc": [[2, 0.6]]}
    assert results.first_difference([base, dict(base)]) is None
    later = {"score": [[1, 0.3], [2, 0.4], [3, 0.55]], "val_acc": [[2, 0.6]]}
    assert results.first_difference([base, later]) == 3
    val_only = {"score": base["score"], "val_acc": [[2, 0.7]]}
    assert results.first_difference([base, val_only]) == 2
    short = {"score": [[1, 0.3], [2, 0.4]], "val_acc": [[2, 0.6]]}  # a run that logged fewer steps
    assert results.first_difference([base, short]) == 3


def test_entries_without_records_are_named_not_measured():
    runs = [record("demo", 0, 0.305, 1.0, True)]
    page = results.render(runs, {"demo": {"config": "configs/demo.yaml"}, "video": {"config": "configs/video_demo.yaml"}})
    assert "## Not measured" in page and "`video` (configs/video_demo.yaml)" in page
    assert "## Not measured" not in results.render(runs, {"demo": {"config": "configs/demo.yaml"}})


def test_a_record_dumps_to_json_that_loads_back_equal():
    r = record("demo", 0, 0.305, 1.0, True)
    assert json.loads(results.dump_record(r)) == r
    r.pop("curves")
    assert json.loads(results.dump_record(r)) == r


def test_a_record_of_another_config_is_stale_and_shows_no_figure():
    """A record counts only while its entry, args and resolved config are the ones that ran: the real config hash
    of configs/demo.yaml makes it current; other args, a config that resolves elsewhere, or a dropped entry, stale."""
    matrix = {"demo": {"config": "configs/demo.yaml", "args": [], "seeds": [0]}}
    run = record("demo", 0, 0.305, 0.987654, True)
    run["config_sha256"] = results.config_hash("configs/demo.yaml", ["seed=0"])
    assert results.find_stale([run], matrix) == []
    assert "0.988" in results.page([run], matrix)
    other_seed = {**run, "seed": 1}  # the hash includes the seed
    assert [why for _, why in results.find_stale([other_seed], matrix)] == ["configs/demo.yaml now resolves to another config"]
    spelt_out = {"demo": {**matrix["demo"], "args": ["rollout.n=8"]}}  # the config's own value: the same run
    assert results.find_stale([run], spelt_out) == []
    moved = {"demo": {**matrix["demo"], "args": ["actor.lr=1e-4"]}}
    assert [why for _, why in results.find_stale([run], moved)] == ["configs/demo.yaml now resolves to another config"]
    assert [why for _, why in results.find_stale([run], {"demo": {"config": "configs/ppo_image.yaml", "args": []}})] \
        == ["the entry now runs configs/ppo_image.yaml"]
    assert [why for _, why in results.find_stale([run], {})] == ["its entry is no longer in results/matrix.yaml"]
    stale_page = results.page([run], moved)
    assert "0.988" not in stale_page and "## Stale records" in stale_page
    assert "| demo | 0 | `0123456` | configs/demo.yaml now resolves to another config |" in stale_page
    assert "`demo` (configs/demo.yaml)" in stale_page  # its entry counts as not measured


def test_no_committed_record_is_stale_without_being_named():
    """Each committed record is either current or listed as stale on the committed page."""
    records, matrix = results.load_records(), results.load_matrix()
    text = results.DOC.read_text()
    for r, why in results.find_stale(records, matrix):
        assert f"| {r['entry']} | {r['seed']} | `{r['commit'][:7]}` | {why} |" in text


def test_the_demos_table_lists_every_shipped_demo_with_its_bar_and_marks_a_miss():
    runs = [record("ppo", 0, 0.305, 0.998, True), record("ppo", 1, 0.2, 0.96, True),
            record("lora", 0, 0.305, 0.825, False, args=["actor.lr=1e-3"]),
            record("lever", 0, 0.3, 0.6, False, "levers")]
    runs[2]["title"] = "Colour, GRPO with LoRA (`configs/demo_lora.yaml`)"
    matrix = {"ppo": {"config": "configs/demo.yaml", "demo": True},
              "lora": {"config": "configs/demo.yaml", "args": ["actor.lr=1e-3"], "demo": True}}
    page = results.render(runs, matrix)
    table = page.split("## Each demo against its bar", 1)[1].split("\n## ", 1)[0]
    assert "| [ppo](#ppo) | `configs/demo.yaml` | rl_acc>=0.95 | 0.998 | 0.960 | 2 of 2 |" in table
    assert ("| [lora](#colour-grpo-with-lora-configsdemo_lorayaml) | `configs/demo.yaml` `actor.lr=1e-3` | "
            "rl_acc>=0.95 | 0.825 |  | **0 of 1** |") in table
    assert "lever" not in table  # not a shipped demo: its own section and its group's table only


def test_a_bar_judges_a_record_and_changing_it_keeps_the_record_current():
    """The hash leaves the bar out (it judges a run, it does not change it); the page judges each record against
    its entry's bar as it is now."""
    assert results.config_hash("configs/demo.yaml", ["seed=0"]) == \
        results.config_hash("configs/demo.yaml", ["seed=0", "bar.rl_acc=0.5", "bar.rl_minutes=0"])
    assert results.config_hash("configs/demo.yaml", ["seed=0"]) != results.config_hash("configs/demo.yaml", ["seed=1"])
    run = {**record("demo", 0, 0.305, 0.96, True), "stage_seconds": {"rl": 270.0}}
    run["config_sha256"] = results.config_hash("configs/demo.yaml", ["seed=0"])
    shipped = {"demo": {"config": "configs/demo.yaml", "args": [], "seeds": [0]}}  # rl_acc>=0.95, rl_minutes<=4.0
    assert "| 0 | 0.305 | 0.960 | +0.655 | 3.25 | 4.5 | **no** |" in results.page([run], shipped)  # 4.5 RL minutes
    relaxed = {"demo": {**shipped["demo"], "args": ["bar.rl_minutes=0"]}}
    assert results.find_stale([run], relaxed) == []
    assert "| 0 | 0.305 | 0.960 | +0.655 | 3.25 | 4.5 | yes |" in results.page([run], relaxed)
    stricter = {"demo": {**shipped["demo"], "args": ["bar.rl_minutes=0", "bar.rl_acc=0.99"]}}
    assert "Bar (rl_acc>=0.99): met on 0 of 1 seeds." in results.page([run], stricter)


def test_the_converter_s_keys_count_only_for_a_run_on_a_user_s_file():
    """A synthetic run reads none of data.jsonl/format/image_dir/split: changing them leaves its hash; a run on a
    user's file reads them, so there they change it."""
    base = results.config_hash("configs/demo.yaml", ["seed=0"])
    assert base == results.config_hash("configs/demo.yaml", ["seed=0", "data.split=val", "data.format=verl"])
    user = ["seed=0", "data.jsonl=my.parquet", "data.format=verl"]
    assert results.config_hash("configs/demo.yaml", user) != base
    assert results.config_hash("configs/demo.yaml", user) != results.config_hash("configs/demo.yaml",
                                                                               [*user, "data.split=val"])


def test_a_key_added_later_changes_the_hash_only_away_from_its_old_behaviour():
    """The keys of LATER_KEYS at their old values leave the hash as it was before they existed; any other value is
    another run."""
    base = results.config_hash("configs/demo.yaml", ["seed=0"])
    assert base == results.config_hash("configs/demo.yaml", ["seed=0", "trainer.stop_val_acc=0", "tracking.mfu=true"])
    assert base != results.config_hash("configs/demo.yaml", ["seed=0", "trainer.stop_val_acc=0.95"])
    assert base != results.config_hash("configs/demo.yaml", ["seed=0", "tracking.mfu=false"])
