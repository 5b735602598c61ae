"""The sweep's table: the late means it reads back from a real MLflow store, and its rows as markdown; the
sweep files: every shipped variant is a valid run config."""

import shutil
from pathlib import Path

import pytest

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from mmrl.run_config import load_run_config
from pipelines.sweep import DEFAULT_CONFIG, late_mean, load_spec, markdown, merge_rows, run_row, select

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = sorted(ROOT.joinpath("configs/sweeps").glob("*.yaml"))


def test_late_means_are_over_the_last_tenth_of_the_logged_steps(empty_mlflow_db, tmp_path):
    db = tmp_path / "mlflow.db"
    shutil.copyfile(empty_mlflow_db, db)
    client = MlflowClient(f"sqlite:///{db}")
    run = client.create_run(client.create_experiment("sweep-test")).info.run_id
    flat = [i / 40 for i in range(40)]  # steps 1..40; the last tenth: steps 37-40
    client.log_batch(run, metrics=[Metric("critic/flat_groups", v, 0, i + 1) for i, v in enumerate(flat)]
                     + [Metric("timing_s/step", s, 0, i + 1) for i, s in enumerate([3.0, 1.0, 2.0])])
    assert late_mean(client, run, "critic/flat_groups") == pytest.approx(sum(flat[-4:]) / 4)
    assert late_mean(client, run, "actor/entropy") is None
    row = run_row(client, run)
    assert row["s_per_step"] == 2.0 and row["flat"] == pytest.approx(sum(flat[-4:]) / 4) and row["entropy"] is None


def test_the_table_keeps_failed_runs_with_their_error():
    table = markdown([{"variant": "grpo", "seed": 0, "sft_acc": 0.3625, "test_acc": 0.5, "gain": 0.1375},
                      {"variant": "bad", "seed": 0, "error": "ConfigError: no"}])
    lines = table.splitlines()
    assert lines[0].startswith("| variant | seed | sft_acc | test_acc | gain |") and len(lines) == 4
    assert "| grpo | 0 | 0.362 | 0.500 | 0.138 |" in lines[2] and lines[3].endswith("| ConfigError: no |")


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_variant_of_a_shipped_sweep_is_a_valid_run_config(path):
    """What the sweep loads for each run (its seed's paths, the variant, the steps), so a renamed or refused key
    fails here rather than minutes into a sweep."""
    spec = load_spec(path)
    where = ["seed=1", "model.path=m", "data.dir=d", "sft.out_dir=s", "trainer.init=s/checkpoint",
             "trainer.resume=never"]
    for name, overrides in spec["variants"].items():
        cfg = load_run_config(ROOT / spec.get("config", DEFAULT_CONFIG),
                              [*spec.get("overrides", []), *where, *overrides, f"trainer.out_dir=o/{name}",
                               *([f"trainer.steps={spec['steps']}"] if spec.get("steps") else [])])
        assert cfg.seed == 1 and cfg.trainer.out_dir == f"o/{name}"


@pytest.mark.parametrize("text,message", [
    ("variants: {a: []}\nsteps: 3\nseed: [1]\n", r"unknown keys \['seed'\]"),
    ("steps: 3\n", "no variants"),
])
def test_a_sweep_file_with_an_unknown_key_or_no_variant_is_refused(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_spec(path)


def test_a_later_sweep_replaces_its_own_rows_and_keeps_the_others():
    earlier = [{"variant": "grpo", "seed": 0, "test_acc": 0.5}, {"variant": "grpo", "seed": 1, "test_acc": 0.6}]
    again = merge_rows(earlier, {"variant": "grpo", "seed": 1, "test_acc": 0.7})
    assert again == [earlier[0], {"variant": "grpo", "seed": 1, "test_acc": 0.7}]
    new = merge_rows(again, {"variant": "cispo", "seed": 1, "test_acc": 0.4})
    assert new == [*again, {"variant": "cispo", "seed": 1, "test_acc": 0.4}]


def test_a_part_of_the_sweep_is_chosen_by_seed_and_variant_name():
    spec = {"seeds": [0, 1, 2], "variants": {"a": ["x=1"], "b": [], "c": ["y=2"]}}
    assert select(spec, None, None) == ([0, 1, 2], spec["variants"])
    assert select(spec, "2,0", "c,a") == ([2, 0], {"c": ["y=2"], "a": ["x=1"]})
    assert select({"variants": {"a": []}}, None, None) == ([0], {"a": []})
    with pytest.raises(ValueError, match=r"\['d'\] not in the sweep file; its variants: \['a', 'b', 'c'\]"):
        select(spec, None, "a,d")
