"""The peers' files as their peers write them (tests/peer_files.py: verl's, EasyR1's and TRL's pipelines, and
``datasets`` folders, on real images) converted by ``make data`` and trained for two GRPO steps each, with what a
verl user expects of the reward: ``data_source`` picks the verifier, ``extra_info`` reaches the reward function.

One test for every layout (the suite's time is tight): the smallest run (2 prompts x 2 samples, 4 new tokens) in
the session's Ray, its workers reused from run to run. The fields' details are the unit tests'
(tests/unit/test_peer_pipelines.py)."""

import copy
import json
import time

from mlflow.tracking import MlflowClient

from mmrl.trainer.dataset import load_rows
from mmrl.trainer.run import run_rl
from pipelines import data as data_stage
from tests import peer_files

REWARD = '''import json

def score(response, ground_truth, data_source, extra_info=None):
    with open({log!r}, "a") as log:
        log.write(json.dumps({{"data_source": data_source, "ground_truth": ground_truth, "extra_info": extra_info}}) + "\\n")
    return float(len(response) % 2)
'''


def layouts(tmp_path):
    """Per layout: (data.format, data.image_dir, [(data.jsonl, data.split)]) as its user converts it."""
    media = tmp_path / "media"
    folders = {name: tmp_path / name for name in ("verl", "easyr1", "trl", "hf")}
    for folder in folders.values():
        folder.mkdir()
    return {
        # verl's <split>.parquet files: train, and test as the validation set (verl's data.val_files).
        "verl": ("verl", "", [(peer_files.verl_parquet(folders["verl"], "train", 4), "train"),
                              (peer_files.verl_parquet(folders["verl"], "test", 2, start=4), "val")]),
        "easyr1": ("easyr1", media, [(peer_files.easyr1_parquet_with_paths(folders["easyr1"], media, "train", 4), ""),
                                     (peer_files.easyr1_parquet_with_paths(folders["easyr1"], media, "test", 2),
                                      "validation")]),
        "trl": ("trl", "", [(peer_files.trl_parquet(folders["trl"], "train", 4), "train"),
                            (peer_files.trl_parquet(folders["trl"], "test", 2, start=4), "dev")]),
        "hf_dataset": ("hf", "", [(peer_files.trl_folder(folders["hf"], "train", 4), ""),
                                  (peer_files.trl_folder(folders["hf"], "test", 2, start=4), "val")]),
        # A DatasetDict of train / validation / test: one conversion writes all three where mmrl reads them.
        "hf_dataset_dict": ("hf", "", [(peer_files.easyr1_dataset_dict(folders["hf"], {"train": 4, "validation": 2,
                                                                                       "test": 2}), "")]),
    }


def test_every_peer_layout_converts_and_trains_two_steps(tiny_config, tiny_model_dir, tmp_path, capsys):
    started = time.monotonic()
    log = tmp_path / "reward_calls.jsonl"
    reward = tmp_path / "logging_reward.py"
    reward.write_text(REWARD.format(log=str(log)))
    client, seconds = MlflowClient(tiny_config.tracking.uri), {}
    for name, (fmt, image_dir, conversions) in layouts(tmp_path).items():
        data_dir = tmp_path / "data" / name
        for source, split in conversions:
            media = [f"data.image_dir={image_dir}"] if image_dir else []
            data_stage.main(["--config", "", f"model.path={tiny_model_dir}", f"data.dir={data_dir}", *media,
                             f"data.format={fmt}", f"data.jsonl={source}", f"data.split={split}",
                             "data.max_pixels=3136"])
        printed = capsys.readouterr().out
        assert "quarantined=0" in printed and "quarantined=1" not in printed, printed
        written = {split: len(load_rows(data_dir, split)) for split in ("train", "val")}
        assert written == {"train": 4, "val": 2}, (name, written)
        if name == "hf_dataset_dict":
            assert len(load_rows(data_dir, "test")) == 2

        cfg = copy.deepcopy(tiny_config)
        cfg.data.dir, cfg.trainer.out_dir = str(data_dir), str(tmp_path / "rl" / name)
        cfg.trainer.steps, cfg.trainer.eval_every, cfg.trainer.val_size = 2, 0, 2
        cfg.trainer.prompts_per_step, cfg.rollout.n, cfg.rollout.max_new_tokens = 2, 2, 4
        cfg.actor.num_mini_batches = 1
        cfg.reward.function, cfg.reward.isolation = f"{reward}:score", "inline"
        cfg.reward.verifiers = {"sklearn/digits": "numeric"}  # verl's rows name their source: it picks the verifier
        run_started = time.monotonic()
        result = run_rl(cfg)
        seconds[name] = time.monotonic() - run_started
        run = client.get_run(result["mlflow_run_id"])
        assert run.info.status == "FINISHED", name
        assert [m.step for m in client.get_metric_history(run.info.run_id, "actor/pg_loss")] == [1, 2], name
        assert ("reward/numeric/score" in run.data.metrics) == (name == "verl"), name
        source = "sklearn/digits" if name == "verl" else "user"
        assert f"val/{source}/acc" in run.data.metrics, (name, sorted(run.data.metrics))

    calls = [json.loads(line) for line in log.read_text().splitlines()]
    verl_calls = [c for c in calls if c["data_source"] == "sklearn/digits"]
    # 2 steps x 2 prompts x 2 samples; each row's extra_info as verl's preprocessing wrote it.
    assert len(verl_calls) == 8
    assert all(c["extra_info"] == {"split": "train", "index": c["extra_info"]["index"]} for c in verl_calls)
    assert {c["extra_info"]["index"] for c in verl_calls} <= {0, 1, 2, 3}
    assert all(c["extra_info"] is None for c in calls if c["data_source"] != "sklearn/digits")
    total = time.monotonic() - started
    print(f"peer layouts: {total:.1f} s in all; RL runs: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
