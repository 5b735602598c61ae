"""Every model family on 1 and 2 ranks: each vision/LLM layout gives the one-rank update, and a saved training
state resumes bit for bit.

One 2-rank worker group serves every family (a group start costs about 10 CPU-seconds); the one-rank reference
runs in the test process, without Ray, on the same worker class. Each family's batch mixes a two-image prompt,
a video prompt (where the family takes video) and text-only prompts, in micro-batches of 2, so that some
micro-batches hold no media and a sharded tower runs its dummy pass. Log-probs and metrics are held to
``test_sharding.py``'s tolerances (the same math in another reduction order); the weights after Adam's first
step to :func:`first_step_tolerance`, which follows from that step's form.
"""

from __future__ import annotations

import functools

import pytest
import torch
from PIL import Image

from mmrl.config import PartConfig, VisionPartConfig, load_config
from mmrl.controller import ResourcePool, WorkerGroup
from mmrl.models.encoding import encode_prompt
from mmrl.models.families import FAMILIES, family_of_processor
from mmrl.models.loading import load_processor
from mmrl.protocol import Batch
from mmrl.schema import Video
from benchmarks.probes import ProbedActor

LR = 1e-3
# (vision, llm, activation checkpointing of both parts). Sharded: FSDP2 units are the family's vision blocks and
# decoder layers, recomputed in the backward. Vision replicated: the family's tower is left out of the LLM's
# sharding and its gradients are all-reduced by hand. (A sharded tower beside a replicated LLM is the first
# layout's tower beside the second's LLM; test_sharding.py runs it on the fixtures' Qwen2.5-VL.)
SHARDED = ("fsdp", "fsdp", True)
VISION_REPLICATED = ("replicate", "fsdp", False)


@pytest.fixture(scope="module")
def pair():
    group = WorkerGroup(ProbedActor, ResourcePool(2, cpus_per_worker=0.25, name="families2", reuse=True), threads=1, device="cpu")
    yield group
    group.shutdown()


def configure(model_dir, vision: str = "replicate", llm: str = "replicate", checkpointing: bool = False):
    cfg = load_config(None, ["model.compile=false", f"model.path={model_dir}", "rollout.n=1"])
    cfg.actor.vision = VisionPartConfig(strategy=vision, activation_checkpointing=checkpointing)
    cfg.actor.llm = PartConfig(strategy=llm, activation_checkpointing=checkpointing)
    cfg.actor.lr, cfg.actor.warmup_steps, cfg.actor.grad_clip = LR, 0, 1.0
    cfg.actor.num_mini_batches, cfg.actor.micro_batch_size = 1, 2
    cfg.actor.use_kl_loss = False
    return cfg


@functools.cache
def family_batches(model_dir) -> tuple[Batch, Batch]:
    """Two batches of the same 6 samples (prompts and responses), with different advantages: one per update.
    (Built once per family; the calls never change a Batch they are given.)"""
    processor = load_processor(model_dir)
    red, blue = Image.new("RGB", (56, 56), (255, 0, 0)), Image.new("RGB", (84, 56), (0, 0, 255))
    specs = [("<image><image>Which colours?", [red, blue], [])]
    if family_of_processor(processor).takes_video:
        clip = Video(frames=[Image.new("RGB", (56, 56), (0, 200, 0))] * 4, timestamps=[0.0, 0.5, 1.0, 1.5])
        specs.append(("<video>Which colour?", [], [clip]))
    specs += [("Name a colour" + "!" * i, [], []) for i in range(6 - len(specs))]
    prompts = [encode_prompt(processor, [{"role": "user", "content": text}], images, videos)
               for text, images, videos in specs]
    tokenizer = processor.tokenizer
    special = set(tokenizer.all_special_ids)
    plain = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    gen = torch.Generator().manual_seed(0)
    responses = plain[torch.randint(len(plain), (6, 5), generator=gen)]
    mask = torch.ones(6, 5)
    mask[2, 3:] = 0
    mask[4, 1:] = 0
    return tuple(Batch(tensors={"responses": responses, "response_mask": mask,
                                "advantages": torch.randn(6, 1, generator=gen) * mask}, objects={"prompt": prompts})
                 for _ in range(2))


def update(worker, batch: Batch):
    """old log-probs -> one update -> (log-probs, per-rank metrics, per-rank full weights after it).
    ``worker`` is a WorkerGroup or an in-process worker (whose results are wrapped as one rank's)."""
    batch = batch.union(worker.compute_log_probs(batch))
    metrics, states = worker.update_actor(batch), worker.full_state_dict()
    if isinstance(worker, ProbedActor):
        metrics, states = [metrics], [states]
    return batch["old_log_probs"], metrics, states


def in_process(model_dir) -> ProbedActor:
    """A one-rank worker in the test process (no Ray, no process group), everything replicated."""
    worker = ProbedActor(0, 1, threads=0, device="cpu")
    worker.init_model(configure(model_dir), str(model_dir), False, with_rollout=False)
    return worker


@pytest.fixture(scope="module")
def references(family_dirs):
    """family -> (initial weights, the one-rank update on the first batch)."""
    out = {}

    def get(family: str):
        if family not in out:
            worker = in_process(family_dirs[family])
            initial = worker.full_state_dict()
            out[family] = initial, update(worker, family_batches(family_dirs[family])[0])
        return out[family]

    return get


def first_step_tolerance(initial: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """How far another reduction order may move each weight of one first AdamW step (no weight decay).

    That step moves a weight by ``lr * s`` with ``s = g / (|g| + eps)`` (bias-corrected; eps 1e-8), read back
    from the reference step. A gradient off by d moves it by about ``lr * (1 - |s|)^2 * d / eps`` more: nothing
    where |g| >> eps, up to ``lr * d / eps`` where the gradient is itself float noise (such elements occur: one of
    qwen2_vl's o_proj weights had |g| ~ 3e-9 and moved 0.23 lr on one thread, 0.01 lr on two). Allowed: d = eps
    (the gradients' float noise was measured at a few 1e-9), plus 1e-2 * lr everywhere, far below the lr-sized
    step of every other weight.
    """
    s = ((after - initial).abs() / LR).clamp(max=1.0)
    return LR * (1e-2 + (1 - s) ** 2)


def assert_same_update(result, reference, initial: dict[str, torch.Tensor] | None) -> None:
    """``result`` equals ``reference``: within the layout tolerances of one first step from ``initial``, or
    bit for bit when ``initial`` is None."""
    logp, metrics, states = result
    ref_logp, ref_metrics, ref_states = reference
    exact = initial is None
    logp_tol, rel, atol = (0.0, 0.0, 0.0) if exact else (1e-5, 1e-5, 1e-7)
    assert torch.allclose(logp, ref_logp, atol=logp_tol, rtol=0), float((logp - ref_logp).abs().max())
    for m in metrics:
        assert m == metrics[0]  # reduced over ranks: identical everywhere
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl"):
            assert m[key] == pytest.approx(ref_metrics[0][key], rel=rel, abs=atol), key
    for state in states:
        assert state.keys() == ref_states[0].keys()
        for name, tensor in ref_states[0].items():
            if exact:
                assert torch.equal(state[name], tensor), name
            else:
                excess = (state[name] - tensor).abs() - first_step_tolerance(initial[name], tensor)
                assert float(excess.max()) <= 0, f"{name}: {float(excess.max())} beyond the tolerance"


@pytest.fixture(scope="module")
def sharded(pair, family_dirs, tmp_path_factory):
    """family -> two updates on two ranks, vision and LLM sharded and recomputed: (the first update, its
    training state's folder, saved between the two, the second update)."""
    out = {}

    def get(family: str):
        if family not in out:
            model_dir = family_dirs[family]
            first, second = family_batches(model_dir)
            pair.init_model(configure(model_dir, *SHARDED), str(model_dir), False, with_rollout=False)
            one = update(pair, first)
            folder = tmp_path_factory.mktemp(f"state-{family}")
            pair.save_state(str(folder))
            out[family] = one, folder, update(pair, second)
        return out[family]

    return get


@pytest.mark.parametrize("family", list(FAMILIES))
def test_two_ranks_update_as_one_rank_does_in_each_layout(pair, family_dirs, references, sharded, family):
    model_dir = family_dirs[family]
    initial, reference = references(family)
    moved = max(float((reference[2][0][n] - t).abs().max()) for n, t in initial.items())
    assert moved > 0.5 * LR  # an lr-sized step: the tolerance is far below it
    assert_same_update(sharded(family)[0], reference, initial)
    pair.init_model(configure(model_dir, *VISION_REPLICATED), str(model_dir), False, with_rollout=False)
    report = pair.layout_report()[0]
    assert report["sharded"] > 0 and report["replicated"] > 0
    assert_same_update(update(pair, family_batches(model_dir)[0]), reference, initial)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_saved_train_state_resumes_bit_for_bit(pair, family_dirs, sharded, family):
    """Update, save, update equals update, save, (a fresh model) load, update, bit for bit: the weights,
    Adam's moments and step, the LR schedule and the generators all came back."""
    model_dir = family_dirs[family]
    (_, _, after_first), folder, straight = sharded(family)
    assert any(not torch.equal(straight[2][0][n], t) for n, t in after_first[0].items())
    pair.init_model(configure(model_dir, *SHARDED), str(model_dir), False, with_rollout=False)
    pair.load_state(str(folder))
    assert all(torch.equal(state[n], t) for state in pair.full_state_dict() for n, t in after_first[0].items())
    assert_same_update(update(pair, family_batches(model_dir)[1]), straight, None)
