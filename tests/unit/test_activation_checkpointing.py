"""Activation checkpointing per part: the same gradients as the plain path, and the blocks really recompute."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from PIL import Image

from mmrl.algos.actor_loss import ActorLoss
from mmrl.config import ActorConfig, CriticConfig, PartConfig, VisionPartConfig, load_config
from mmrl.models.encoding import encode_prompt, vision_token_ids
from mmrl.models.forward import PolicyForward, ValueModel
from mmrl.models.loading import load_model, load_processor
from mmrl.models.logprobs import response_logprobs
from mmrl.parallel.checkpointing import apply_activation_checkpointing
from mmrl.parallel.sharding import model_blocks, shard_parts
from mmrl.protocol import Batch
from mmrl.workers.actor import LogProbSpec, PolicyUpdater, batched_logprobs
from mmrl.workers.critic import ValueUpdater
from mmrl.workers.model_builder import build_model

CPU = torch.device("cpu")


def no_reduce(t: torch.Tensor) -> torch.Tensor:
    return t


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    """The tiny model (float32, no dropout) and a batch of 2 image prompts and 1 text prompt, 2 samples each."""
    model, processor = load_model(tiny_model_dir), load_processor(tiny_model_dir)
    assert model.config.text_config.attention_dropout == 0 and model.dtype == torch.float32
    prompts = [encode_prompt(processor, [{"role": "user", "content": "<image>What colour?"}],
                             [Image.new("RGB", (56, 56), c)]) for c in [(255, 0, 0), (0, 0, 255)]]
    prompts.append(encode_prompt(processor, [{"role": "user", "content": "Text only?"}], []))
    gen = torch.Generator().manual_seed(0)
    responses, mask = torch.randint(20, 200, (6, 5), generator=gen), torch.ones(6, 5)
    mask[1, 3:] = 0
    batch = Batch(tensors={"responses": responses, "response_mask": mask,
                           "advantages": torch.randn(6, 1, generator=gen) * mask},
                  objects={"prompt": [p for p in prompts for _ in range(2)]})
    spec = LogProbSpec(processor.tokenizer.pad_token_id, vision_token_ids(processor), 1.0, 64)
    return model, batch, spec


def count_forwards(root: torch.nn.Module) -> Counter:
    """Counts every call of a vision block (key "vision") and of a decoder layer (key "llm"). A pre-hook: a
    recompute stops once it has rebuilt what the backward needs (torch's early stop), before any forward hook."""
    calls: Counter = Counter()
    _, blocks, layers = model_blocks(root)
    for part, units in (("vision", blocks), ("llm", layers)):
        for unit in units:
            unit.register_forward_pre_hook(lambda *_, part=part: calls.update([part]))
    return calls


def parts(vision: bool, llm: bool, freeze: bool = False) -> tuple[VisionPartConfig, PartConfig]:
    return VisionPartConfig(activation_checkpointing=vision, freeze=freeze), PartConfig(activation_checkpointing=llm)


def policy_step(model, batch, spec, vision: bool, llm: bool, freeze: bool = False):
    """One on-policy update (one micro-batch) of a copy of ``model``: (its gradients by name, block calls)."""
    model = copy.deepcopy(model)
    root = PolicyForward(model)
    if freeze:
        root.core.visual.requires_grad_(False)
    cfg = ActorConfig(lr=1e-2, warmup_steps=0, num_mini_batches=1, micro_batch_size=64, grad_clip=1e9)
    cfg.vision, cfg.llm = parts(vision, llm, freeze)
    layout = shard_parts(root, cfg.vision, cfg.llm, 1, CPU)
    calls = count_forwards(root)
    PolicyUpdater(layout, cfg, ActorLoss("ppo_clip"), spec, CPU, no_reduce).update(batch)
    grads = {name: p.grad for name, p in model.named_parameters()}
    return grads, calls, root


@pytest.mark.parametrize("vision,llm", [(True, False), (False, True), (True, True)])
def test_a_policy_update_with_checkpointing_has_the_plain_gradients_and_recomputes_each_block(setup, vision, llm):
    model, batch, spec = setup
    plain, plain_calls, _ = policy_step(model, batch, spec, False, False)
    grads, calls, _ = policy_step(model, batch, spec, vision, llm)
    num_blocks, num_layers = (len(units) for units in model_blocks(PolicyForward(model))[1:])
    assert plain_calls == {"vision": num_blocks, "llm": num_layers}  # one micro-batch: one forward each
    assert calls == {"vision": num_blocks * (1 + vision), "llm": num_layers * (1 + llm)}  # + the recompute
    assert all(g is not None for g in plain.values())
    for name, grad in plain.items():
        assert torch.allclose(grads[name], grad, atol=1e-6, rtol=0), name


def test_a_frozen_tower_with_checkpointing_trains_nothing_and_recomputes_nothing(setup):
    model, batch, spec = setup
    plain, _, _ = policy_step(model, batch, spec, False, False, freeze=True)
    grads, calls, root = policy_step(model, batch, spec, True, True, freeze=True)
    num_blocks, num_layers = (len(units) for units in model_blocks(root)[1:])
    assert calls == {"vision": num_blocks, "llm": 2 * num_layers}  # nothing recorded in the tower: no recompute
    for name, grad in plain.items():
        if grad is None:
            assert grads[name] is None, name  # the tower's parameters
        else:
            assert torch.allclose(grads[name], grad, atol=1e-6, rtol=0), name
    assert any(g is None for g in grads.values()) and any(g is not None for g in grads.values())


def test_no_grad_passes_and_eval_mode_run_each_block_once(setup):
    """The log-prob pass (no_grad, on a model the update left in training mode) and an eval-mode backward (the
    frozen reference, the rollout engine's module) compute each block once, with the plain path's values."""
    model, batch, spec = setup
    _, _, root = policy_step(model, batch, spec, True, True)
    assert root.training  # as the update leaves it
    calls = count_forwards(root)
    logp, _ = batched_logprobs(root, batch, spec, CPU, with_entropy=False)
    num_blocks, num_layers = (len(units) for units in model_blocks(root)[1:])
    assert calls == {"vision": num_blocks, "llm": num_layers}
    plain = copy.deepcopy(root)
    for block in (*model_blocks(plain)[1], *model_blocks(plain)[2]):
        block.gradient_checkpointing = False
    expected, _ = batched_logprobs(plain, batch, spec, CPU, with_entropy=False)
    assert torch.equal(logp, expected)
    calls.clear()
    logp, _ = response_logprobs(root.eval(), batch["prompt"][:2], batch["responses"][:2], batch["response_mask"][:2],
                                pad_token_id=spec.pad_token_id, banned_ids=spec.banned_ids,
                                temperature=spec.temperature, device=CPU)
    logp.sum().backward()
    assert calls == {"vision": num_blocks, "llm": num_layers}


def test_a_value_update_with_checkpointing_has_the_plain_gradients(setup):
    model, batch, spec = setup
    batch = batch.union(Batch(tensors={"values": torch.zeros(6, 5), "returns": torch.randn(6, 5) * batch["response_mask"]}))
    grads = []
    for on in (False, True):
        root = ValueModel.from_policy(copy.deepcopy(model))
        torch.nn.init.normal_(root.value_head.weight, generator=torch.Generator().manual_seed(0))  # not 0: the
        # zero-initialised head would pass the backbone zero gradients
        cfg = CriticConfig(lr=1e-2, warmup_steps=0, num_mini_batches=1, micro_batch_size=64, grad_clip=1e9)
        cfg.vision, cfg.llm = parts(on, on)
        layout = shard_parts(root, cfg.vision, cfg.llm, 1, CPU)
        calls = count_forwards(root)
        ValueUpdater(layout, cfg, spec.pad_token_id, CPU, no_reduce).update(batch)
        num_blocks, num_layers = (len(units) for units in model_blocks(root)[1:])
        assert calls == {"vision": num_blocks * (1 + on), "llm": num_layers * (1 + on)}
        grads.append({name: p.grad for name, p in root.named_parameters()})
    assert all(g is not None and g.abs().sum() > 0 for g in grads[0].values())
    for name, grad in grads[0].items():
        assert torch.allclose(grads[1][name], grad, atol=1e-6, rtol=0), name


def test_the_config_keys_reach_each_role_and_a_block_of_another_kind_is_refused(tiny_model_dir):
    cfg = load_config(None, ["actor.llm.activation_checkpointing=true", "critic.vision.activation_checkpointing=true"])
    actor = build_model(cfg, "actor", str(tiny_model_dir), device=CPU, distributed=False)
    critic = build_model(cfg, "critic", str(tiny_model_dir), device=CPU, distributed=False)
    for layout, vision, llm in ((actor, False, True), (critic, True, False)):
        _, blocks, layers = model_blocks(layout.root)
        assert {b.gradient_checkpointing for b in blocks} == {vision}
        assert {layer.gradient_checkpointing for layer in layers} == {llm}
    with pytest.raises(TypeError, match="llm.activation_checkpointing=false"):
        apply_activation_checkpointing([torch.nn.Linear(2, 2)], "llm")
