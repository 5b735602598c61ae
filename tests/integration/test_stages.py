"""The sft, eval and data stages as a user runs them (real model, real MLflow store, real files)."""

import json
from pathlib import Path

from mlflow.tracking import MlflowClient
from PIL import Image

from pipelines import data as data_stage
from mmrl.trainer.eval_checkpoint import run_eval
from mmrl.trainer.sft import run_sft


def test_sft_then_eval_write_checkpoint_and_mlflow_metrics(tiny_config):
    cfg = tiny_config
    cfg.sft.steps = 3
    sft = run_sft(cfg)
    assert (Path(sft["checkpoint"]) / "model.safetensors").is_file()
    client = MlflowClient(cfg.tracking.uri)
    assert len(client.get_metric_history(sft["mlflow_run_id"], "sft/loss")) == 3
    result = run_eval(cfg, sft["checkpoint"])
    assert result["counts"]["all"] == 16  # the whole test split
    assert 0.0 <= result["accuracy"]["all"] <= 1.0
    metrics = client.get_run(result["mlflow_run_id"]).data.metrics
    assert {"test/acc", "test/synthetic/colour/acc", "test/synthetic/count/acc"} <= set(metrics)


def test_data_stage_converts_user_jsonl_with_quarantine(tmp_path, capsys, tiny_model_dir):
    images = tmp_path / "imgs"
    images.mkdir()
    Image.new("RGB", (300, 200), (10, 200, 10)).save(images / "ok.png")
    (images / "broken.png").write_bytes(b"not a png")
    lines = [
        {"prompt": "What colour?", "image": "ok.png", "answer": "green", "source_id": 7},
        {"prompt": "What colour?", "image": "missing.png", "answer": "red"},
        {"prompt": "What colour?", "image": "broken.png", "answer": "red"},
    ]
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in lines) + "\n{not json\n")
    out = tmp_path / "out"
    data_stage.main(["--config", "", f"data.jsonl={jsonl}", f"data.image_dir={images}", f"data.dir={out}",
                     "data.max_pixels=12544", f"model.path={tiny_model_dir}"])
    printed = capsys.readouterr().out
    assert "in=4 written=1 quarantined=3" in printed
    quarantined = [json.loads(x) for x in (out / "train.quarantine.jsonl").read_text().splitlines()]
    assert sorted(q["kind"] for q in quarantined) == ["corrupt", "invalid_json", "missing_file"]
    from data_prep.schema import decode_images, read_parquet

    rows = read_parquet(out / "train.parquet")
    (image,) = decode_images(rows[0])
    assert image.width * image.height <= 12544 and image.width % 28 == 0
    assert json.loads(rows[0]["extra"])["source_id"] == 7
