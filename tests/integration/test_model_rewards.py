"""Model-based rewards on real Ray worker groups: the ``make rm`` stage, a reward model laid out on two ranks, a
generative judge, and both inside an RL run next to a rule reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from mmrl.answer_format import format_answer
from mmrl.config import load_config
from mmrl.controller import ResourcePool, WorkerGroup
from mmrl.models.loading import load_processor
from mmrl.plugins.safe_text import clean
from mmrl.protocol import Batch
from mmrl.rollout.samples import encode_rows
from mmrl.schema import decode_images
from mmrl.trainer.dataset import load_rows, rows_to_batch
from mmrl.trainer.run import run_rl
from mmrl.trainer.rm import response_ids
from mmrl.trainer.sft import pad_targets
from mmrl.workers.judge import JudgeWorker
from mmrl.workers.model_builder import build_model
from mmrl.workers.reward_model import RewardModelWorker, sequence_scores
from pipelines import rm as rm_stage
from rewards.judge import judge_messages, parse_verdict

TEXTS = ["<answer>red</answer>", "<answer>blue</answer>", "green", "<answer>3</answer>", "<answer>", "no"]


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, random_reward_model) -> Path:
    """The tiny model as a reward model with a random (non-zero) head."""
    return random_reward_model(tiny_model_dir, tmp_path_factory.mktemp("rm") / "checkpoint")


RM_STAGE = ["rm.steps=3", "rm.batch_size=8", "rm.pairs_per_prompt=2", "rm.warmup_steps=0", "rm.lr=1e-2",
            "rm.eval_pairs=16"]


@pytest.fixture(scope="module")
def make_rm(tiny_model_dir: Path, tiny_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """The ``make rm`` stage as a user runs it, with no pairs given: (its result, its rm.out_dir)."""
    out = tmp_path_factory.mktemp("make-rm")
    result = rm_stage.main(["--config", "", f"model.path={tiny_model_dir}", f"rm.init={tiny_model_dir}",
                            f"data.dir={tiny_data_dir}", f"rm.out_dir={out}", f"tracking.uri=sqlite:///{out}/mlflow.db",
                            f"tracking.artifact_dir={out}/artifacts", *RM_STAGE])
    return result, out


def pairs_batch(processor, rows: list[dict], texts: list[str]) -> Batch:
    """One sample per (row, response text), the responses right-padded; a row given twice is encoded once."""
    tok = processor.tokenizer
    ids, mask = pad_targets([response_ids(tok, t) for t in texts], tok.pad_token_id)
    distinct = list({str(r["id"]): r for r in rows}.values())
    encoded = dict(zip((str(r["id"]) for r in distinct), encode_rows(processor, rows_to_batch(distinct))))
    batch = rows_to_batch(rows)
    batch.objects["prompt"] = [encoded[str(r["id"])] for r in rows]
    batch.objects["response_text"] = list(texts)
    batch.tensors.update(responses=ids, response_mask=mask)
    return batch


def scored_batch(cfg, processor) -> Batch:
    """Six samples of three prompts, responses of different lengths, right-padded."""
    rows = load_rows(cfg.data.dir, "train")[:3]
    return pairs_batch(processor, [r for r in rows for _ in range(2)], TEXTS)


def test_make_rm_writes_synthetic_pairs_trains_and_saves_a_reward_model(make_rm, tiny_data_dir):
    """With rm.train_pairs and rm.val_pairs empty the stage writes pairs of each split's rows; the checkpoint it
    saves (backbone + trained head) scores the held-out pairs with the accuracy and margin it logged."""
    result, out = make_rm
    per_prompt = 2
    for split in ("train", "val"):
        rows = {str(r["id"]): r for r in load_rows(tiny_data_dir, split)}
        pairs = [json.loads(line) for line in (out / f"pairs_{split}.jsonl").read_text().splitlines()]
        assert sorted(p["prompt_id"] for p in pairs) == sorted(list(rows) * per_prompt)
        assert all(p["chosen"] == format_answer(rows[p["prompt_id"]]["answer"]) != p["rejected"] for p in pairs)
    checkpoint = out / "checkpoint"
    assert result["checkpoint"] == str(checkpoint) and (checkpoint / "model.safetensors").is_file()
    assert float(load_file(str(checkpoint / "value_head.safetensors"))["weight"].abs().sum()) > 0  # trained from 0

    client = MlflowClient(f"sqlite:///{out}/mlflow.db")
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rm/loss")] == [1, 2, 3]
    assert run.data.metrics["rm/val_pairwise_acc"] == result["val_pairwise_acc"]

    cfg = load_config(None, ["model.compile=false", f"data.dir={tiny_data_dir}", f"reward.model.path={checkpoint}"])
    val = {str(r["id"]): r for r in load_rows(tiny_data_dir, "val")}
    held_out = [json.loads(line) for line in (out / "pairs_val.jsonl").read_text().splitlines()][:16]
    processor = load_processor(checkpoint)
    batch = pairs_batch(processor, [val[p["prompt_id"]] for p in held_out] * 2,
                        [p["chosen"] for p in held_out] + [p["rejected"] for p in held_out])
    model = build_model(cfg, "reward_model", str(checkpoint), device=torch.device("cpu"), distributed=False)
    with torch.no_grad():
        scores = sequence_scores(model.root, batch, processor.tokenizer.pad_token_id, torch.device("cpu"))
    chosen, rejected = scores[:16], scores[16:]
    assert run.data.metrics["rm/val_pairwise_acc"] == pytest.approx(float((chosen > rejected).float().mean()))
    assert run.data.metrics["rm/val_margin"] == pytest.approx(float((chosen - rejected).mean()), abs=1e-5)
    assert float((chosen - rejected).abs().min()) > 0  # a head that tells the responses apart


def test_a_reward_model_on_two_fsdp_ranks_scores_like_one_process(tiny_config, reward_model_dir):
    cfg = tiny_config
    cfg.reward.model.path = str(reward_model_dir)
    cfg.reward.model.llm.strategy, cfg.reward.model.vision.strategy = "fsdp", "fsdp"
    processor = load_processor(reward_model_dir)
    batch = scored_batch(cfg, processor)
    group = WorkerGroup(RewardModelWorker, ResourcePool(2, cpus_per_worker=1, reuse=True), threads=1, device="cpu")
    try:
        group.init_model(cfg, str(reward_model_dir))
        scores = group.compute_rm_scores(batch)["rm_scores"]
    finally:
        group.shutdown()
    local = build_model(cfg, "reward_model", str(reward_model_dir), device=torch.device("cpu"), distributed=False)
    with torch.no_grad():
        expected = sequence_scores(local.root, batch, processor.tokenizer.pad_token_id, torch.device("cpu"))
    assert scores.shape == (6,)
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)
    assert expected.abs().min() > 0 and len(set(expected.tolist())) == 6  # a real, sample-dependent head


def judge_questions(batch: Batch, template: str) -> list[tuple[list[dict], list]]:
    """The judge's questions as (messages, PIL images), one per sample."""
    return [(judge_messages(batch["messages"][i], batch["response_text"][i], batch["answer"][i], template),
             decode_images({"images": batch["images"][i]})) for i in range(len(batch))]


def test_the_judge_asks_through_its_engine_and_parses_each_verdict(tiny_config, tiny_model_dir, reference_greedy):
    cfg = tiny_config
    cfg.reward.judge.path = str(tiny_model_dir)
    batch = scored_batch(cfg, load_processor(tiny_model_dir))
    group = WorkerGroup(JudgeWorker, ResourcePool(1, cpus_per_worker=1, reuse=True), threads=1, device="cpu")
    try:
        group.init_model(cfg, str(tiny_model_dir))
        out = group.judge(batch)
    finally:
        group.shutdown()
    generated = reference_greedy(tiny_model_dir, judge_questions(batch, cfg.reward.judge.template),
                                 cfg.reward.judge.max_new_tokens)
    expected = [clean(text) for text in generated]  # the judge's answers are made safe before they are parsed
    assert out["judge_text"] == expected
    verdicts = [parse_verdict(t) for t in expected]
    assert out["judge_scores"].tolist() == [v or 0.0 for v in verdicts]
    assert out["judge_parsed"].tolist() == [float(v is not None) for v in verdicts]


def test_rl_with_a_reward_model_a_judge_and_a_rule_sums_them_by_weight(tiny_config, reward_model_dir, tiny_model_dir):
    """The training reward is rules + 0.5 x reward model + 2 x judge, with every part logged."""
    cfg = tiny_config
    cfg.trainer.steps, cfg.trainer.eval_every = 2, 0
    cfg.reward.weights = {"answer_match": 1.0}
    cfg.reward.model.path, cfg.reward.model.weight = str(reward_model_dir), 0.5
    cfg.reward.judge.path, cfg.reward.judge.weight = str(tiny_model_dir), 2.0
    result = run_rl(cfg)
    client = MlflowClient(cfg.tracking.uri)
    for step in (1, 2):
        def metric(key: str) -> float:
            return next(m.value for m in client.get_metric_history(result["mlflow_run_id"], key) if m.step == step)
        parts = metric("reward/score/mean") + 0.5 * metric("reward/model/score") + 2.0 * metric("reward/judge/score")
        assert metric("reward/score/total") == pytest.approx(parts, abs=1e-5)
        assert metric("critic/score/mean") == pytest.approx(parts, abs=1e-5)  # what the advantages were made from
        assert metric("reward/model/std") > 0


def test_rlhf_on_policy_with_the_make_rm_reward_model_alone(tiny_config, make_rm):
    """``make rm`` then ``make rl`` with its checkpoint as the only reward. One epoch of one mini-batch
    (actor.old_log_probs=auto): the update's own forward gives the old log-probs, so the step takes no separate
    old-log-prob pass and every ratio is 1 (no KL to the old policy, nothing clipped)."""
    cfg = tiny_config
    cfg.trainer.steps, cfg.trainer.eval_every = 2, 0
    cfg.reward.function, cfg.reward.weights = "none", {}
    cfg.reward.model.path = make_rm[0]["checkpoint"]
    cfg.actor.ppo_epochs, cfg.actor.num_mini_batches = 1, 1
    result = run_rl(cfg)
    client = MlflowClient(cfg.tracking.uri)
    run = client.get_run(result["mlflow_run_id"])
    metrics = run.data.metrics
    assert run.info.status == "FINISHED"
    assert metrics["critic/score/mean"] == pytest.approx(metrics["reward/model/score"], abs=1e-5)
    assert metrics["reward/model/std"] > 0  # the trained head was loaded (a zero head scores all alike)
    assert "reward/score/mean" not in metrics and "train/acc" in metrics  # no rule reward; still verified
    assert "timing_s/old_log_prob" not in metrics and "timing_s/gen" in metrics
    for key in ("actor/ppo_kl", "actor/pg_clipfrac"):
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] == [(1, 0.0), (2, 0.0)]


def test_a_plugin_that_hangs_costs_a_step_about_one_timeout(tiny_config, tmp_path):
    """A plugin holding the GIL forever on every sample: each step's reward stage tries it only on the first
    sample of each reward worker (the plugin logs its calls, so they are counted, not timed), the run
    finishes on the other component, and the hangs are counted per step."""
    calls = tmp_path / "calls.txt"
    plugin = tmp_path / "stuck.py"
    plugin.write_text(f"import re\n\ndef stuck(response):\n    open({str(calls)!r}, 'a').write('x\\n')\n"
                      "    return float(bool(re.match(r'(a+)+$', 'a' * 64 + 'b')))\n")
    cfg = tiny_config
    cfg.trainer.steps, cfg.trainer.eval_every = 2, 0
    cfg.reward.weights = {"answer_match": 1.0, f"{plugin}:stuck": 1.0}
    cfg.reward.timeout_s, cfg.reward.max_failed_steps = 2.0, 5
    result = run_rl(cfg)
    client = MlflowClient(cfg.tracking.uri)
    history = {key: [m.value for m in client.get_metric_history(result["mlflow_run_id"], key)]
               for key in ("timing_s/reward", "reward/stuck/failures/timeout", "reward/stuck/score")}
    print(f"reward stage with a hung plugin, timeout 2 s: {history['timing_s/reward']} s")
    samples = cfg.trainer.prompts_per_step * cfg.rollout.n
    assert history["reward/stuck/failures/timeout"] == [samples, samples]
    assert history["reward/stuck/score"] == [0.0, 0.0]
    tried = len(calls.read_text().splitlines())
    assert 1 <= tried <= cfg.reward.num_workers * cfg.trainer.steps < samples, f"{tried} samples tried"
    one_timeout_per_sample = samples / cfg.reward.num_workers * cfg.reward.timeout_s
    assert all(seconds < one_timeout_per_sample for seconds in history["timing_s/reward"])

