"""Every model family learns: a short GRPO run lifts the colour task's test accuracy past the SFT start.

The demo's recipe (``configs/demo.yaml``: a tiny random-init model, 30 SFT steps on 48 labelled rows, GRPO with
the verifier reward and a KL anchor) on a tiny model of each family, for STEPS steps instead of 400 (the cosine
decay follows the shorter run). Accuracies are greedy, on the 400-row test split, of the SFT and the RL
checkpoints. Minutes per family on 2 idle CPU cores, far more on shared ones: a benchmark, run by
``make bench-learning``, not ``make test``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mmrl.config import load_config
from mmrl.models.families import FAMILIES
from mmrl.models.tiny import build_tiny_vlm
from mmrl.trainer.eval_checkpoint import run_eval
from mmrl.trainer.run import run_rl
from mmrl.trainer.sft import run_sft
from pipelines import data, model

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
STEPS = 200
EVAL_EVERY = 50  # the validation curve (64 rows) that the test prints
MARGIN = 0.15  # the demo's bar: rl_acc >= sft_acc + 0.15


@pytest.mark.learning
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_short_grpo_run_lifts_each_family_past_its_sft_start(family, tmp_path, capsys):
    cfg = load_config(str(DEMO), [
        f"model.family={family}", f"model.path={tmp_path / 'model'}", f"data.dir={tmp_path / 'data'}",
        "data.sizes={sft: 48, train: 2048, val: 64, test: 400}", f"sft.out_dir={tmp_path / 'sft'}",
        f"trainer.out_dir={tmp_path / 'rl'}", f"trainer.steps={STEPS}", f"trainer.eval_every={EVAL_EVERY}",
        "trainer.resume=never", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"tracking.artifact_dir={tmp_path / 'artifacts'}"])
    build_tiny_vlm(model.task_corpus(cfg), cfg.tiny_model, cfg.model.path, cfg.seed, cfg.model.family)
    data.synthetic(cfg)
    sft = run_sft(cfg)["checkpoint"]
    cfg.trainer.init = sft
    run_id = run_rl(cfg)["mlflow_run_id"]
    sft_acc = run_eval(cfg, sft, "eval-sft")["accuracy"]["all"]
    rl_acc = run_eval(cfg, str(Path(cfg.trainer.out_dir) / "checkpoint"), "eval-rl")["accuracy"]["all"]
    history = MlflowClient(cfg.tracking.uri).get_metric_history(run_id, "val/acc")
    curve = " ".join(f"{m.step}:{m.value:.2f}" for m in sorted(history, key=lambda m: m.step))
    with capsys.disabled():
        print(f"\n{family}: sft_acc={sft_acc:.3f} rl_acc={rl_acc:.3f} after {STEPS} GRPO steps (val {curve})")
    assert rl_acc >= sft_acc + MARGIN, f"{family}: rl_acc {rl_acc:.3f} < sft_acc {sft_acc:.3f} + {MARGIN}"
