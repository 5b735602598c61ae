"""Trajectories with holes on the tiny model: log-probs and entropies (packed and unpacked) at the policy's
tokens are those of the forward without holes marked, 0 at holes; the actor's and the critic's updates with
holes give the gradients of a loss written as a loop over the policy's tokens only (the holes' terms dropped);
without holes, a policy_mask equal to the response_mask changes no bit."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from PIL import Image

from mmrl import trajectory
from mmrl.algos.actor_loss import ActorLoss
from mmrl.config import ActorConfig, CriticConfig
from mmrl.models.encoding import encode_prompt
from mmrl.models.forward import PolicyForward, ValueModel
from mmrl.models.loading import load_model, load_processor
from mmrl.models.logprobs import response_logprobs
from mmrl.parallel.sharding import shard_parts
from mmrl.protocol import Batch
from mmrl.workers.actor import LogProbSpec, PolicyUpdater, batched_logprobs
from mmrl.workers.critic import ValueUpdater, batch_values

CPU = torch.device("cpu")
R = 6
# per row: the extent's length and its holes (one; several; one at the end; all hole but one; none)
ROWS = [(6, [2]), (6, [1, 2, 4]), (5, [4]), (4, [0, 1, 3]), (3, []), (6, [5]), (2, [])]


def no_reduce(t: torch.Tensor) -> torch.Tensor:
    return t


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    torch.manual_seed(0)
    model, processor = load_model(tiny_model_dir, "float32", "sdpa", CPU), load_processor(tiny_model_dir)
    image = encode_prompt(processor, [{"role": "user", "content": "<image>What colour?"}],
                          [Image.new("RGB", (56, 56), (200, 30, 30))])
    text = encode_prompt(processor, [{"role": "user", "content": "Name a colour."}], [])
    prompts = [image] * 4 + [text] * 3  # repeats: the packed path packs them
    gen = torch.Generator().manual_seed(1)
    pad = processor.tokenizer.pad_token_id
    extent = torch.tensor([[1.0] * n + [0.0] * (R - n) for n, _ in ROWS])
    policy = extent.clone()
    for b, (_, holes) in enumerate(ROWS):
        policy[b, holes] = 0.0
    responses = torch.randint(10, 300, extent.shape, generator=gen).masked_fill(extent == 0, pad)
    spec = LogProbSpec(pad, [], 1.0, 64)
    return model, processor, Batch(tensors={"responses": responses, "response_mask": extent, "policy_mask": policy},
                                   objects={"prompt": prompts}), spec


def logprobs(model, batch, spec, share: bool, policy_mask, banned=()):
    return response_logprobs(PolicyForward(model), batch["prompt"], batch["responses"], batch["response_mask"],
                             pad_token_id=spec.pad_token_id, banned_ids=list(banned), temperature=0.8, device=CPU,
                             share_prompt=share, policy_mask=policy_mask, with_entropy=True)


@pytest.mark.parametrize("share", [False, True])
def test_log_probs_at_policy_tokens_are_those_without_holes_marked_and_zero_at_holes(setup, share):
    model, _, batch, spec = setup
    extent, policy = batch["response_mask"], batch["policy_mask"]
    plain = logprobs(model, batch, spec, share, None)
    holed = logprobs(model, batch, spec, share, policy)
    on, off = policy > 0, (extent > 0) & (policy == 0)
    for p, h in zip(plain, holed):
        assert torch.equal(h[on], p[on]) and (h[~on] == 0).all()
        assert (p[off] != 0).all()  # the holes were scored before they were marked
    assert all(torch.equal(a, b) for a, b in zip(logprobs(model, batch, spec, share, extent.clone()), plain))
    # a hole may hold a token the policy can never sample (logp -inf): still 0, never NaN
    banned = int(batch["responses"][1, 1])
    logp, entropy = logprobs(model, batch, spec, share, policy, banned=[banned])
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all() and logp[1, 1] == 0
    assert logprobs(model, batch, spec, share, None, banned=[banned])[0][1, 1] == -torch.inf


def with_update_fields(batch: Batch, model, spec) -> Batch:
    """old log-probs (0 at holes) and advantages, with loud garbage at the holes where both are 0 in a real
    step, so that a hole's loss term that were not dropped would show."""
    policy = trajectory.policy_mask(batch)
    old, _ = batched_logprobs(PolicyForward(model), batch, spec, CPU, with_entropy=False)
    holes = (batch["response_mask"] > 0) & (policy == 0)
    gen = torch.Generator().manual_seed(2)
    advantages = torch.randn(policy.shape, generator=gen) * batch["response_mask"]
    out = Batch(tensors=dict(batch.tensors), objects=dict(batch.objects))
    out.tensors["old_log_probs"] = torch.where(holes, torch.full_like(old, -3.0), old + 0.05 * advantages)
    out.tensors["advantages"] = torch.where(holes, torch.full_like(advantages, 50.0), advantages)
    return out


def reference_gradients(model, batch, spec, cfg: ActorConfig) -> dict[str, torch.Tensor]:
    """The clipped PPO loss written as a loop over the policy's tokens only, on the plain forward."""
    model = copy.deepcopy(model).train()
    logp, _ = response_logprobs(PolicyForward(model), batch["prompt"], batch["responses"], batch["response_mask"],
                                pad_token_id=spec.pad_token_id, banned_ids=[], temperature=1.0, device=CPU)
    per_seq = []
    for b in range(len(batch)):
        terms = []
        for t in range(R):
            if batch["policy_mask"][b, t] > 0:
                ratio = torch.exp(logp[b, t] - batch["old_log_probs"][b, t])
                adv = batch["advantages"][b, t]
                terms.append(torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_ratio_low,
                                                                            1 + cfg.clip_ratio_high)))
        per_seq.append(terms)
    if cfg.loss_agg_mode == "token-mean":
        loss = torch.stack([x for terms in per_seq for x in terms]).sum() / sum(map(len, per_seq))
    else:  # seq-mean-token-mean
        loss = torch.stack([torch.stack(terms).mean() for terms in per_seq]).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def update_gradients(model, batch, spec, cfg: ActorConfig) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    trained = copy.deepcopy(model)
    layout = shard_parts(PolicyForward(trained), cfg.vision, cfg.llm, 1, CPU)
    metrics = PolicyUpdater(layout, cfg, ActorLoss("ppo_clip"), spec, CPU, no_reduce).update(batch)
    return {n: p.grad for n, p in trained.named_parameters() if p.grad is not None}, metrics


@pytest.mark.parametrize(("agg", "micro", "budget", "share"), [
    ("token-mean", 3, 0, False), ("seq-mean-token-mean", 2, 0, False), ("seq-mean-token-mean", 64, 30, True)])
def test_an_update_with_holes_has_the_gradients_of_the_loss_without_the_holes_terms(setup, agg, micro, budget, share):
    model, _, batch, spec = setup
    spec = dataclasses.replace(spec, share_prompt=share)
    batch = with_update_fields(batch, model, spec)
    cfg = ActorConfig(lr=1e-2, warmup_steps=0, num_mini_batches=1, micro_batch_size=micro, grad_clip=1e9,
                      max_tokens_per_micro=budget, share_prompt=share, loss_agg_mode=agg)
    expected = reference_gradients(model, batch, spec, cfg)
    grads, metrics = update_gradients(model, batch, spec, cfg)
    assert grads.keys() == expected.keys()
    for name, g in grads.items():
        assert torch.allclose(g, expected[name], atol=1e-6 if share else 1e-7, rtol=1e-4), name
    assert abs(metrics["actor/ppo_kl"] - float(0.05 * (batch["advantages"] * batch["policy_mask"]).sum()
                                               / batch["policy_mask"].sum())) < 1e-5


def test_without_holes_a_policy_mask_equal_to_the_response_mask_changes_no_bit(setup):
    model, _, batch, spec = setup
    plain = Batch(tensors={k: v for k, v in batch.tensors.items() if k != "policy_mask"}, objects=dict(batch.objects))
    plain = with_update_fields(plain, model, spec)
    marked = Batch(tensors={**plain.tensors, "policy_mask": plain["response_mask"].clone()}, objects=plain.objects)
    cfg = ActorConfig(lr=1e-2, warmup_steps=0, num_mini_batches=1, micro_batch_size=3, entropy_coeff=0.01,
                      use_kl_loss=True, loss_agg_mode="seq-mean-token-mean")
    for b in (plain, marked):
        b.tensors["ref_log_probs"] = plain["old_log_probs"] - 0.1
    (grads_a, metrics_a), (grads_b, metrics_b) = (update_gradients(model, b, spec, cfg) for b in (plain, marked))
    assert metrics_a == metrics_b
    assert all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)


def test_the_critic_update_with_holes_regresses_the_policy_tokens_only(setup):
    model, _, batch, spec = setup
    critic = ValueModel.from_policy(copy.deepcopy(model))
    torch.nn.init.normal_(critic.value_head.weight, std=0.1)
    gen = torch.Generator().manual_seed(3)
    holes = (batch["response_mask"] > 0) & (batch["policy_mask"] == 0)
    work = Batch(tensors=dict(batch.tensors), objects=dict(batch.objects))
    work.tensors["values"] = torch.where(holes, torch.full(holes.shape, 40.0), torch.randn(holes.shape, generator=gen))
    work.tensors["returns"] = torch.where(holes, torch.full(holes.shape, -40.0), torch.randn(holes.shape, generator=gen))
    cfg = CriticConfig(lr=1e-3, warmup_steps=0, num_mini_batches=1, micro_batch_size=3, cliprange_value=0.5,
                       loss_agg_mode="seq-mean-token-mean", grad_clip=1e9)

    reference = copy.deepcopy(critic).train()
    values = batch_values(reference, work, spec.pad_token_id, CPU)
    per_seq = []
    for b in range(len(work)):
        terms = []
        for t in range(R):
            if work["policy_mask"][b, t] > 0:
                v, old, ret = values[b, t], work["values"][b, t], work["returns"][b, t]
                clipped = old + (v - old).clamp(-0.5, 0.5)
                terms.append(0.5 * torch.maximum((v - ret) ** 2, (clipped - ret) ** 2))
        per_seq.append(torch.stack(terms).mean())
    torch.stack(per_seq).mean().backward()

    trained = copy.deepcopy(critic)
    layout = shard_parts(trained, cfg.vision, cfg.llm, 1, CPU)
    ValueUpdater(layout, cfg, spec.pad_token_id, CPU, no_reduce).update(work)
    for (name, p), q in zip(trained.named_parameters(), reference.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4), name
