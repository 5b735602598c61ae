"""The sft, eval and data stages as a user runs them (real model, real MLflow store, real files)."""

import json
from collections import defaultdict
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from mmrl.schema import decode_images
from mmrl.trainer.dataset import load_rows
from pipelines import data as data_stage
from rewards import answer_match
from mmrl.trainer.eval_checkpoint import run_eval
from mmrl.trainer.sft import run_sft


def test_sft_then_eval_match_a_one_prompt_at_a_time_reference(tiny_config, tmp_path, reference_greedy):
    """Eval's batched greedy answers equal plain single-prompt generation, and its accuracy is the
    configured verifier per data_source: answer_match for colour, a plugin accepting anything for count."""
    cfg = tiny_config
    cfg.sft.steps = 20
    sft = run_sft(cfg)
    assert (Path(sft["checkpoint"]) / "model.safetensors").is_file()
    client = MlflowClient(cfg.tracking.uri)
    assert len(client.get_metric_history(sft["mlflow_run_id"], "sft/loss")) == 20
    lenient = tmp_path / "lenient.py"
    lenient.write_text("def anything(response):\n    return 1.0\n")
    cfg.reward.verifiers = {"synthetic/count": f"{lenient}:anything"}
    result = run_eval(cfg, sft["checkpoint"])

    rows = load_rows(cfg.data.dir, "test")
    texts = reference_greedy(sft["checkpoint"], [(r["messages"], decode_images(r)) for r in rows],
                             cfg.eval.max_new_tokens)
    logged = mlflow.artifacts.load_dict(f"runs:/{result['mlflow_run_id']}/rollouts/test.json")
    assert logged["response"] == texts  # the first 16 samples: the whole 16-row test split
    expected = defaultdict(list)
    for row, text in zip(rows, texts):
        lenient_source = row["data_source"] == "synthetic/count"
        expected[row["data_source"]].append(1.0 if lenient_source else answer_match(text, row["answer"]))
    assert result["counts"] == {"synthetic/colour": 8, "synthetic/count": 8, "all": 16}
    for source, scores in expected.items():
        assert result["accuracy"][source] == pytest.approx(sum(scores) / len(scores))
    assert result["accuracy"]["synthetic/count"] == 1.0
    metrics = client.get_run(result["mlflow_run_id"]).data.metrics
    assert metrics["test/acc"] == pytest.approx(sum(sum(s) for s in expected.values()) / 16)
    table = mlflow.artifacts.load_dict(f"runs:/{result['mlflow_run_id']}/eval/test_accuracy_by_source.json")
    by_source = dict(zip([row[0] for row in table["data"]], [row[1] for row in table["data"]]))
    assert table["columns"] == ["data_source", "accuracy", "prompts"]
    assert by_source == pytest.approx({**{s: sum(v) / len(v) for s, v in expected.items()},
                                       "all": metrics["test/acc"]})


def test_data_stage_converts_user_jsonl_with_quarantine(tmp_path, capsys, tiny_model_dir):
    images = tmp_path / "imgs"
    images.mkdir()
    Image.new("RGB", (300, 200), (10, 200, 10)).save(images / "ok.png")
    (images / "broken.png").write_bytes(b"not a png")
    lines = [
        {"prompt": "What colour?", "image": "ok.png", "answer": "green", "source_id": 7},
        {"prompt": "What colour?", "image": "missing.png", "answer": "red"},
        {"prompt": "What colour?", "image": "broken.png", "answer": "red"},
        {"prompt": "What colour? " * 40, "image": "ok.png", "answer": "green"},  # over 64 tokens
    ]
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in lines) + "\n{not json\n")
    out = tmp_path / "out"
    data_stage.main(["--config", "", f"data.jsonl={jsonl}", f"data.image_dir={images}", f"data.dir={out}",
                     "data.max_pixels=12544", f"model.path={tiny_model_dir}", "data.max_prompt_tokens=64"])
    printed = capsys.readouterr().out
    assert "in=5 written=1 quarantined=4" in printed
    quarantined = [json.loads(x) for x in (out / "train.quarantine.jsonl").read_text().splitlines()]
    assert sorted(q["kind"] for q in quarantined) == ["corrupt", "invalid_json", "missing_file", "too_long"]
    (long,) = [q for q in quarantined if q["kind"] == "too_long"]
    assert "over max_prompt_tokens=64" in long["reason"]
    from mmrl.schema import decode_images, read_parquet

    rows = read_parquet(out / "train.parquet")
    (image,) = decode_images(rows[0])
    assert image.width * image.height <= 12544 and image.width % 28 == 0
    assert json.loads(rows[0]["extra"])["source_id"] == 7


def test_data_stage_mixes_video_and_multi_image_tasks_by_config(tmp_path, capsys):
    out = tmp_path / "data"
    data_stage.main(["--config", "", f"data.dir={out}", "data.tasks={first_colour: 0.5, compare_count: 0.5}",
                     "data.sizes={train: 8, test: 4}", "data.video_size=56"])
    assert "train     8 rows" in capsys.readouterr().out
    from mmrl.schema import read_parquet

    rows = list(read_parquet(out / "train.parquet"))
    videos = [r for r in rows if r["videos"]]
    pairs = [r for r in rows if len(r["images"]) == 2]
    assert len(videos) == 4 and len(pairs) == 4
    assert len(list((out / "media").rglob("*.mp4"))) == 6  # 4 train + 2 test clips, real files
    assert all(len(r["videos"][0]["frames"]) == 4 for r in videos)
