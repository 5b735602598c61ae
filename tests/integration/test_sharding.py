"""Per-part layouts over real Ray worker groups: N=1 vs N=2 and every vision/llm strategy agree.

Tolerances. Log-probs and losses are the same math in a different reduction order (FSDP all-gathers
exact values; the gradient sums over ranks reorder float additions), so they agree to ~1e-7 relative; we
allow 1e-5. Weights after one AdamW step: Adam's first step moves each weight by about
``lr * g / (|g| + eps)``, so a gradient element that is itself at float-noise level (|g| ~ 1e-9) can move
by a noticeable fraction of ``lr`` when its last bits differ. We measured at most 1.2e-3 * lr and allow
1e-2 * lr (1e-5 at lr 1e-3), three orders of magnitude below the update itself.
"""

from __future__ import annotations

import copy

import pytest
import torch
from PIL import Image

from mmrl.config import PartConfig, VisionPartConfig, load_config
from mmrl.controller import ResourcePool, WorkerGroup
from mmrl.models.encoding import encode_prompt
from mmrl.models.loading import load_processor
from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams
from benchmarks.probes import ProbedActor, ProbedCritic

LR = 1e-3
COMBOS = [
    ("replicate", "replicate"),
    ("fsdp", "replicate"),
    ("replicate", "fsdp"),
    ("fsdp", "fsdp"),
    ("hsdp", "hsdp"),  # shard_size 1: 2 replicas of a 1-rank shard group (FSDP's replicate-dim all-reduce)
    ("hsdp", "fsdp"),
    ("hsdp2", "hsdp2"),  # shard_size 2: one 2-rank shard group on a 2-D (1, 2) mesh
]


def part(strategy: str) -> tuple[str, int]:
    """'hsdp2' -> ('hsdp', 2); other names -> (name, 1)."""
    return ("hsdp", 2) if strategy == "hsdp2" else (strategy, 1)


def configure(cfg, vision: str, llm: str, freeze: bool = False, checkpointing: bool = False):
    cfg = copy.deepcopy(cfg)
    (vision, vision_shard), (llm, llm_shard) = part(vision), part(llm)
    cfg.actor.vision = VisionPartConfig(strategy=vision, shard_size=vision_shard, freeze=freeze,
                                        activation_checkpointing=checkpointing)
    cfg.actor.llm = PartConfig(strategy=llm, shard_size=llm_shard, activation_checkpointing=checkpointing)
    cfg.actor.lr, cfg.actor.warmup_steps, cfg.actor.grad_clip = LR, 0, 1.0
    cfg.actor.num_mini_batches, cfg.actor.micro_batch_size = 1, 2
    cfg.actor.use_kl_loss = False
    return cfg


@pytest.fixture(scope="module")
def base_cfg(tiny_model_dir, tiny_data_dir):
    return load_config(None, ["model.compile=false", f"model.path={tiny_model_dir}", f"data.dir={tiny_data_dir}", "rollout.n=2"])


@pytest.fixture(scope="module")
def groups(tiny_model_dir):
    one = WorkerGroup(ProbedActor, ResourcePool(1, cpus_per_worker=0.5, name="n1", reuse=True), threads=1, device="cpu")
    two = WorkerGroup(ProbedActor, ResourcePool(2, cpus_per_worker=0.25, name="n2", reuse=True), threads=1, device="cpu")
    yield one, two
    one.shutdown()
    two.shutdown()


@pytest.fixture(scope="module")
def mixed_batch(tiny_model_dir):
    """1 image prompt (two images) and 5 text-only prompts: token balancing leaves one rank without media."""
    processor = load_processor(tiny_model_dir)
    image = encode_prompt(processor, [{"role": "user", "content": "<image><image>Which colours?"}],
                          [Image.new("RGB", (56, 56), (255, 0, 0)), Image.new("RGB", (84, 56), (0, 0, 255))])
    texts = [encode_prompt(processor, [{"role": "user", "content": "Name a colour" + "!" * i}], []) for i in range(5)]
    prompts = [image, *texts]
    gen = torch.Generator().manual_seed(0)
    responses = torch.randint(20, 200, (6, 5), generator=gen)
    mask = torch.ones(6, 5)
    mask[2, 3:] = 0
    mask[4, 1:] = 0
    advantages = torch.randn(6, 1, generator=gen) * mask
    return Batch(tensors={"responses": responses, "response_mask": mask, "advantages": advantages},
                 objects={"prompt": prompts})


def one_update(group, cfg, model_dir, batch):
    """init -> old log-probs -> one update -> (log-probs, metrics, full weights after the update)."""
    group.init_model(cfg, str(model_dir), False)
    batch = batch.union(group.compute_log_probs(batch))
    metrics = group.update_actor(batch)
    return batch["old_log_probs"], metrics, group.full_state_dict()


@pytest.fixture(scope="module")
def reference(groups, base_cfg, tiny_model_dir, mixed_batch):
    """One worker, everything replicated: the baseline every layout must reproduce."""
    return one_update(groups[0], configure(base_cfg, "replicate", "replicate"), tiny_model_dir, mixed_batch)


def assert_same_update(result, reference):
    logp, metrics, states = result
    ref_logp, ref_metrics, ref_states = reference
    assert torch.allclose(logp, ref_logp, atol=1e-5, rtol=0), float((logp - ref_logp).abs().max())
    for m in metrics:
        assert m == metrics[0]  # reduced over ranks: identical everywhere
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl"):
            assert m[key] == pytest.approx(ref_metrics[0][key], rel=1e-5, abs=1e-7), key
    for state in states:
        for name, tensor in ref_states[0].items():
            diff = float((state[name] - tensor).abs().max())
            assert diff <= 1e-2 * LR, f"{name}: {diff}"


@pytest.mark.parametrize("vision,llm", COMBOS)
def test_two_ranks_match_one_for_every_layout(groups, base_cfg, tiny_model_dir, mixed_batch, reference,
                                              vision, llm):
    result = one_update(groups[1], configure(base_cfg, vision, llm), tiny_model_dir, mixed_batch)
    assert_same_update(result, reference)
    report = groups[1].layout_report()
    sharded_parts = (vision != "replicate") + (llm != "replicate")
    assert (report[0]["sharded"] > 0) == (sharded_parts > 0)
    assert (report[0]["replicated"] > 0) == (sharded_parts < 2)


@pytest.fixture(scope="module")
def media_batch(tiny_model_dir):
    """Video, image + video, two images and text-only prompts: ranks hold different media in every mix."""
    from mmrl.schema import Video

    processor = load_processor(tiny_model_dir)

    def clip(colour):
        return Video(frames=[Image.new("RGB", (56, 56), colour)] * 4, timestamps=[0.0, 0.5, 1.0, 1.5])

    red, blue = Image.new("RGB", (56, 56), (255, 0, 0)), Image.new("RGB", (84, 56), (0, 0, 255))
    specs = [("<video>Which colour first?", [], [clip((0, 200, 0))]),
             ("<image><video>Same?", [red], [clip((200, 0, 0))]),
             ("<image><image>Which colours?", [red, blue], []),
             ("Name a colour.", [], []), ("Name a colour!", [], []), ("Name a colour!!", [], [])]
    prompts = [encode_prompt(processor, [{"role": "user", "content": t}], i, v) for t, i, v in specs]
    gen = torch.Generator().manual_seed(1)
    responses, mask = torch.randint(20, 200, (6, 5), generator=gen), torch.ones(6, 5)
    mask[1, 2:] = 0
    return Batch(tensors={"responses": responses, "response_mask": mask,
                          "advantages": torch.randn(6, 1, generator=gen) * mask}, objects={"prompt": prompts})


@pytest.mark.parametrize("vision,llm,checkpointing", [("fsdp", "fsdp", True), ("fsdp", "replicate", False)])
def test_a_batch_mixing_video_images_and_text_trains_the_same_on_two_ranks(groups, base_cfg, tiny_model_dir,
                                                                          media_batch, vision, llm, checkpointing):
    """The vision tower is sharded, and the ranks see different media (or none): one call per forward on
    every rank keeps the collectives in step, and two ranks compute the update one rank computes. With
    activation checkpointing of both sharded parts (set before fully_shard; the backward recomputes each block
    under FSDP2's hooks) the update is still the plain one-rank update."""
    single = one_update(groups[0], configure(base_cfg, "replicate", "replicate"), tiny_model_dir, media_batch)
    sharded = one_update(groups[1], configure(base_cfg, vision, llm, checkpointing=checkpointing), tiny_model_dir,
                         media_batch)
    assert_same_update(sharded, single)
    assert all(m["perf/max_memory_gb/actor"] > 0 for m in sharded[1])  # the group's peak, in the update's metrics


def test_one_rank_fsdp_matches_replicated(groups, base_cfg, tiny_model_dir, mixed_batch, reference):
    result = one_update(groups[0], configure(base_cfg, "fsdp", "fsdp"), tiny_model_dir, mixed_batch)
    assert_same_update(result, reference)


def test_the_update_moves_the_weights(groups, base_cfg, tiny_model_dir, reference):
    groups[0].init_model(configure(base_cfg, "replicate", "replicate"), str(tiny_model_dir), False)
    initial = groups[0].full_state_dict()[0]
    after = reference[2][0]
    moved = max(float((after[n] - t).abs().max()) for n, t in initial.items())
    assert moved > 0.5 * LR  # an lr-sized step: the 1e-2 * lr tolerance above is far below it


@pytest.mark.parametrize("vision", ["replicate", "fsdp"])
def test_frozen_vision_is_bit_identical_and_has_no_optimizer_state(groups, base_cfg, tiny_model_dir,
                                                                   mixed_batch, vision):
    group = groups[1]
    cfg = configure(base_cfg, vision, "fsdp", freeze=True)
    group.init_model(cfg, str(tiny_model_dir), False)
    before = group.full_state_dict("vision")[0]
    llm_before = group.full_state_dict("llm")[0]
    batch = mixed_batch.union(group.compute_log_probs(mixed_batch))
    group.update_actor(batch)
    after = group.full_state_dict("vision")
    assert before and all(torch.equal(before[k], state[k]) for state in after for k in before)
    llm_after = group.full_state_dict("llm")[0]
    assert any(not torch.equal(llm_before[k], llm_after[k]) for k in llm_before)
    for report in group.layout_report():
        assert report["vision_params_with_optimizer_state"] == 0
        assert report["vision_params_with_grad"] == 0
        assert report["params_with_optimizer_state"] > 0


def test_sharded_rollout_gets_full_weights_and_frees_them(groups, base_cfg, tiny_model_dir):
    """Hybrid engine handoff: gathered weights in the engine for the step's rollouts, freed by release_engine
    (rollout.free_cache_engine), loaded again at the next sync; log-probs match training."""
    from mmrl.trainer.dataset import load_rows, rows_to_batch

    group = groups[1]
    group.init_model(configure(base_cfg, "fsdp", "fsdp"), str(tiny_model_dir), False)
    prompts = rows_to_batch(load_rows(base_cfg.data.dir, "train", limit=3))  # 3 prompts over 2 ranks
    samples = group.generate(prompts, SamplingParams(n=2, max_new_tokens=6))
    assert len(samples) == 6
    full = sum(t.numel() for t in group.full_state_dict()[0].values())
    assert all(r["rollout_params_held"] == full for r in group.layout_report())  # a full copy, not shards
    group.release_engine()
    assert all(r["rollout_params_held"] == 0 for r in group.layout_report())
    assert group.versions() == [(0, None)] * 2
    assert group.sync_weights(False) == [0, 0]  # a freed engine is loaded only when it wakes
    assert group.sync_weights(True) == [1, 1] and group.versions() == [(0, 0)] * 2
    batch = prompts.repeat(2).union(samples)
    batch = batch.union(group.compute_log_probs(batch))
    diff = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs() * batch["response_mask"]
    assert float(diff.max()) < 1e-4


# ---- the critic ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def critic_groups():
    one = WorkerGroup(ProbedCritic, ResourcePool(1, cpus_per_worker=0.5, name="c1", reuse=True), threads=1, device="cpu")
    two = WorkerGroup(ProbedCritic, ResourcePool(2, cpus_per_worker=0.25, name="c2", reuse=True), threads=1, device="cpu")
    yield one, two
    one.shutdown()
    two.shutdown()


def critic_update(group, base_cfg, model_dir, batch, vision: str, llm: str):
    cfg = copy.deepcopy(base_cfg)
    cfg.critic.vision = VisionPartConfig(strategy=vision, shard_size=1)
    cfg.critic.llm = PartConfig(strategy=llm, shard_size=1)
    cfg.critic.lr, cfg.critic.warmup_steps, cfg.critic.num_mini_batches, cfg.critic.micro_batch_size = LR, 0, 1, 2
    group.init_model(cfg, str(model_dir))
    batch = batch.union(group.compute_values(batch))
    gen = torch.Generator().manual_seed(1)
    batch.tensors["returns"] = torch.randn(batch["responses"].shape, generator=gen) * batch["response_mask"]
    metrics = group.update_critic(batch)
    after = group.compute_values(batch)["values"]
    return batch["values"], metrics, group.full_state_dict(), after


@pytest.mark.parametrize("vision,llm", [("fsdp", "fsdp"), ("replicate", "fsdp"), ("fsdp", "replicate")])
def test_critic_two_ranks_match_one(critic_groups, base_cfg, tiny_model_dir, mixed_batch, vision, llm):
    ref_values, ref_metrics, ref_states, ref_after = critic_update(
        critic_groups[0], base_cfg, tiny_model_dir, mixed_batch, "replicate", "replicate")
    values, metrics, states, after = critic_update(critic_groups[1], base_cfg, tiny_model_dir, mixed_batch, vision, llm)
    assert torch.equal(ref_values, torch.zeros_like(ref_values))  # zero-initialised value head
    assert torch.equal(values, ref_values)
    for key in ("critic/vf_loss", "critic/grad_norm", "critic/vf_clipfrac"):
        assert metrics[0][key] == metrics[1][key] == pytest.approx(ref_metrics[0][key], rel=1e-5), key
    assert ref_metrics[0]["critic/vf_loss"] > 0
    for state in states:
        for name, tensor in ref_states[0].items():
            assert float((state[name] - tensor).abs().max()) <= 1e-2 * LR, name
    assert torch.allclose(after, ref_after, atol=1e-5)
    assert float(ref_after.abs().max()) > 0  # the update moved the values


@pytest.mark.parametrize("rank_count,vision,llm", [(1, "replicate", "replicate"), (2, "fsdp", "fsdp"),
                                                   (2, "replicate", "fsdp")])
def test_sharded_reference_is_the_initial_policy_and_stays_put(groups, base_cfg, tiny_model_dir, mixed_batch,
                                                               reference, rank_count, vision, llm):
    """The reference is laid out like the actor, starts equal to it, and does not move when the actor does."""
    group = groups[rank_count - 1]
    cfg = configure(base_cfg, vision, llm)
    cfg.actor.use_kl_loss = True
    group.init_model(cfg, str(tiny_model_dir))
    ref_logp = group.compute_ref_log_probs(mixed_batch)["ref_log_probs"]
    assert torch.allclose(ref_logp, reference[0], atol=1e-5)  # = the one-rank policy's log-probs
    batch = mixed_batch.union(group.compute_log_probs(mixed_batch)).union(Batch(tensors={"ref_log_probs": ref_logp}))
    metrics = group.update_actor(batch)
    assert metrics[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # first update: policy == reference
    moved = group.compute_log_probs(mixed_batch)["old_log_probs"]
    assert float((moved - ref_logp).abs().max()) > 1e-4
    assert torch.equal(group.compute_ref_log_probs(mixed_batch)["ref_log_probs"], ref_logp)


# ---- LoRA ------------------------------------------------------------------------------------------


def test_lora_on_two_fsdp_ranks_matches_one_rank_syncs_merged_weights_and_resumes(groups, base_cfg, tiny_model_dir,
                                                                                  mixed_batch, reference, tmp_path):
    """LoRA adapters inside FSDP2 units (frozen base and trained adapters in one decoder layer or vision block):
    two ranks compute the one-rank update; the reference (adapters off) is the base; the sharded engine's own
    copy receives the merged weights (its log-probs are the trained policy's); the adapters and their optimizer
    state resume exactly, into another layout too."""
    from mmrl.config import LoRAConfig
    from mmrl.trainer.dataset import load_rows, rows_to_batch

    lr = 1e-2  # a step that moves the policy's log-probs far beyond the engine/trainer tolerance below

    def lora(vision: str, llm: str):
        cfg = configure(base_cfg, vision, llm)
        cfg.actor.lr = lr
        cfg.actor.lora = LoRAConfig(rank=4, alpha=8.0, include_vision=True)
        return cfg

    results = []
    for group, layout in ((groups[0], ("replicate", "replicate")), (groups[1], ("fsdp", "fsdp"))):
        group.init_model(lora(*layout), str(tiny_model_dir), True)
        ref = group.compute_ref_log_probs(mixed_batch)["ref_log_probs"]
        batch = mixed_batch.union(group.compute_log_probs(mixed_batch))
        results.append((ref, batch["old_log_probs"], group.update_actor(batch), group.full_state_dict()))
    (ref1, old1, metrics1, states1), (ref2, old2, metrics2, states2) = results
    for logp in (ref1, old1, ref2, old2):  # lora_B starts at zero: the policy starts as the base
        assert torch.allclose(logp, reference[0], atol=1e-5, rtol=0)
    assert metrics2[0] == metrics2[1]
    assert metrics2[0]["actor/grad_norm"] == pytest.approx(metrics1[0]["actor/grad_norm"], rel=1e-5)
    assert states1[0].keys() == states2[0].keys() == reference[2][0].keys()  # merged: the base's names
    for name, tensor in states1[0].items():
        for state in states2:
            assert float((state[name] - tensor).abs().max()) <= 1e-2 * lr, name
    group = groups[1]
    after = group.compute_ref_log_probs(mixed_batch)["ref_log_probs"]
    assert torch.allclose(after, reference[0], atol=1e-5, rtol=0)  # the base did not move

    prompts = rows_to_batch(load_rows(base_cfg.data.dir, "train", limit=3))
    group.forget_prompts()  # a new step, as the driver begins one: earlier tests generated on this shared group
    samples = group.generate(prompts, SamplingParams(n=2, max_new_tokens=6))
    full = sum(t.numel() for t in states2[0].values())
    assert all(r["rollout_params_held"] == full for r in group.layout_report())  # the merged model, no adapters
    scored = prompts.repeat(2).union(samples)
    trained = group.compute_log_probs(scored)["old_log_probs"]
    untrained = group.compute_ref_log_probs(scored)["ref_log_probs"]
    mask = scored["response_mask"]
    engine_gap = float(((trained - scored["rollout_log_probs"]).abs() * mask).max())
    assert engine_gap < 1e-4 < float(((trained - untrained).abs() * mask).max())

    group.save_state(str(tmp_path / "lora"))
    for other, layout in ((group, ("fsdp", "fsdp")), (groups[0], ("replicate", "replicate"))):
        other.init_model(lora(*layout), str(tiny_model_dir), False)
        other.load_state(str(tmp_path / "lora"))
        for state in other.full_state_dict():
            assert all(torch.equal(state[n], t) for n, t in states2[0].items())
