"""The policy update, in-process with one rank, against a straightforward full-batch reference."""

import copy
import dataclasses

import pytest
import torch
from PIL import Image

from mmrl.algos.actor_loss import ActorLoss
from mmrl.algos.losses.ppo_clip import ppo_clip_loss
from mmrl.config import ActorConfig, Config
from mmrl.models.encoding import encode_prompt, vision_token_ids
from mmrl.models.loading import load_model, load_processor
from mmrl.models.forward import PolicyForward, core_model
from mmrl.models.logprobs import response_logprobs
from mmrl.parallel.sharding import shard_parts
from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams
from mmrl.rollout.hf import HFRolloutEngine
from mmrl.trainer.old_log_probs import old_log_prob_source
from mmrl.workers.actor import LogProbSpec, PolicyUpdater, batched_logprobs

CPU = torch.device("cpu")


def no_reduce(t: torch.Tensor) -> torch.Tensor:
    return t


def updater_for(model, cfg: ActorConfig, spec, loss: ActorLoss = ActorLoss("ppo_clip")) -> PolicyUpdater:
    """A one-rank updater over ``model`` laid out as ``cfg.vision`` / ``cfg.llm`` say."""
    layout = shard_parts(PolicyForward(model), cfg.vision, cfg.llm, 1, CPU)
    return PolicyUpdater(layout, cfg, loss, spec, CPU, no_reduce)


@pytest.fixture(scope="module")
def rollout_batch(tiny_model_dir):
    model, processor = load_model(tiny_model_dir), load_processor(tiny_model_dir)
    torch.manual_seed(1)
    prompts = [
        encode_prompt(processor, [{"role": "user", "content": "<image>What colour?"}], [Image.new("RGB", (56, 56), c)])
        for c in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    ] + [encode_prompt(processor, [{"role": "user", "content": "Text only?"}], [])]
    out = HFRolloutEngine(model, processor, CPU).generate(prompts, SamplingParams(n=3, max_new_tokens=6))
    batch = Batch(
        tensors={"responses": out.responses, "response_mask": out.response_mask},
        objects={"prompt": [p for p in prompts for _ in range(3)]},
    )
    spec = LogProbSpec(processor.tokenizer.pad_token_id, vision_token_ids(processor), 1.0, 64)
    old, _ = batched_logprobs(PolicyForward(model), batch, spec, CPU, with_entropy=False)
    batch.tensors["old_log_probs"] = old
    batch.tensors["advantages"] = torch.randn(len(batch), 1) * out.response_mask
    return model, batch, spec


def reference_gradients(model, batch, spec, cfg: ActorConfig) -> torch.nn.Module:
    """Clipped gradients of the token-mean clipped loss of the whole batch, written out directly."""
    model = copy.deepcopy(model).train()
    logp, _ = response_logprobs(PolicyForward(model), batch["prompt"], batch["responses"], batch["response_mask"],
                                pad_token_id=spec.pad_token_id, banned_ids=spec.banned_ids, temperature=1.0, device=CPU)
    loss, _ = ppo_clip_loss(logp, batch["old_log_probs"], batch["advantages"], batch["response_mask"],
                            clip_low=cfg.clip_ratio_low, clip_high=cfg.clip_ratio_high)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    return model


@pytest.mark.parametrize(("micro_batch_size", "token_budget", "share_prompt"),
                         [(1, 0, False), (5, 0, False), (64, 0, False), (64, 0, True), (5, 0, True),
                          (64, 40, True), (64, 40, False), (64, 1, True)])
def test_update_equals_full_batch_reference_for_any_micro_batch(rollout_batch, micro_batch_size, token_budget,
                                                                share_prompt):
    """Any micro-batching (rows or a token budget, a budget of 1 giving one row each) and prompt sharing
    (packed rows) give the gradients of the plain full-batch loss: 1e-7 abs unpacked, 1e-6 packed."""
    model, batch, spec = rollout_batch
    spec = dataclasses.replace(spec, share_prompt=share_prompt)
    cfg = ActorConfig(lr=1e-2, warmup_steps=0, num_mini_batches=1, micro_batch_size=micro_batch_size, grad_clip=1.0,
                      max_tokens_per_micro=token_budget, share_prompt=share_prompt)
    expected = reference_gradients(model, batch, spec, cfg)
    trained = copy.deepcopy(model)
    metrics = updater_for(trained, cfg, spec).update(batch)
    # Gradients, not weights: Adam turns float-noise-sized gradients into lr-sized steps.
    for (name, p), q in zip(trained.named_parameters(), expected.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6 if share_prompt else 1e-7, rtol=1e-4), name
    assert not all(torch.equal(p, q) for p, q in zip(trained.parameters(), model.parameters()))
    assert metrics["actor/pg_clipfrac"] == 0.0  # first mini-batch: ratio is 1 everywhere
    assert abs(metrics["actor/ppo_kl"]) < 1e-5


def test_an_on_policy_update_takes_its_old_log_probs_from_its_own_forward(rollout_batch):
    """actor.old_log_probs=auto with one epoch and one mini-batch: no old_log_probs in the batch, and the
    gradients equal those of the update given separately recomputed old log-probs (and the reference's)."""
    model, batch, spec = rollout_batch
    cfg = ActorConfig(lr=1e-2, warmup_steps=0, num_mini_batches=1, micro_batch_size=5, grad_clip=1.0)
    expected = reference_gradients(model, batch, spec, cfg)
    without = Batch(tensors={k: v for k, v in batch.tensors.items() if k != "old_log_probs"},
                    objects=dict(batch.objects))
    trained = copy.deepcopy(model)
    metrics = updater_for(trained, cfg, spec).update(without)
    for (name, p), q in zip(trained.named_parameters(), expected.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-7, rtol=1e-4), name
    assert metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/ppo_kl"] == 0.0
    two_mini_batches = ActorConfig(lr=1e-2, num_mini_batches=2)  # off-policy after the first: must be given
    with pytest.raises(KeyError, match="old_log_probs"):
        updater_for(copy.deepcopy(model), two_mini_batches, spec).update(without)
    sources = [old_log_prob_source(Config(actor=ActorConfig(**kw))) for kw in (
        {"num_mini_batches": 1}, {"num_mini_batches": 2}, {"num_mini_batches": 1, "ppo_epochs": 2},
        {"num_mini_batches": 1, "old_log_probs": "recompute"}, {"num_mini_batches": 4, "old_log_probs": "rollout"},
    )]
    assert sources == ["update", "recompute", "recompute", "recompute", "rollout"]
    kl_in_reward = Config(actor=ActorConfig(num_mini_batches=1))
    kl_in_reward.algorithm.use_kl_in_reward = True  # the penalty reads them before the update
    assert old_log_prob_source(kl_in_reward) == "recompute"


def test_frozen_vision_is_bit_identical_and_has_no_optimizer_state(rollout_batch):
    model, batch, spec = rollout_batch
    trained = copy.deepcopy(model)
    vision = core_model(trained).visual
    vision.requires_grad_(False)
    before = {k: v.clone() for k, v in vision.state_dict().items()}
    updater = updater_for(trained, ActorConfig(lr=1e-2, num_mini_batches=2), spec)
    updater.update(batch)
    assert all(torch.equal(before[k], v) for k, v in vision.state_dict().items())
    vision_ids = {id(p) for p in vision.parameters()}
    assert not any(id(p) in vision_ids for p in updater.optimizer.state)
    assert all(p.grad is None for p in vision.parameters())
    changed = [n for n, p in trained.named_parameters() if not torch.equal(p, dict(model.named_parameters())[n])]
    assert changed, "the LLM part should have been updated"


def test_positive_advantage_raises_the_logprob(rollout_batch):
    model, batch, spec = rollout_batch
    trained = copy.deepcopy(model)
    push = Batch(tensors=dict(batch.tensors), objects=dict(batch.objects))
    push.tensors["advantages"] = batch["response_mask"].clone()  # every sampled token is good
    updater_for(trained, ActorConfig(lr=1e-2, num_mini_batches=1), spec).update(push)
    new, _ = batched_logprobs(PolicyForward(trained), batch, spec, CPU, with_entropy=False)
    mask = batch["response_mask"]
    assert float((new * mask).sum()) > float((batch["old_log_probs"] * mask).sum())


def test_a_non_finite_advantage_or_loss_never_reaches_the_weights(rollout_batch):
    """The mini-batch holding a NaN advantage skips its optimizer step; the other mini-batch updates."""
    model, batch, spec = rollout_batch
    poisoned = batch.select(list(range(len(batch))))
    poisoned.tensors["advantages"][0, 0] = float("nan")  # row 0 is in the first of two mini-batches
    trained = copy.deepcopy(model)
    before = [p.detach().clone() for p in trained.parameters()]
    updater = updater_for(trained, ActorConfig(lr=1e-2, num_mini_batches=2, warmup_steps=0), spec)
    metrics = updater.update(poisoned)
    assert metrics["actor/skipped_updates"] == 1.0
    assert all(torch.isfinite(p).all() for p in trained.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(before, trained.parameters()))  # the second one stepped
    assert updater.scheduler.last_epoch == 1  # only the update that ran advanced the schedule

    inf_loss = batch.select(list(range(len(batch))))
    inf_loss.tensors["old_log_probs"] = torch.full_like(inf_loss["old_log_probs"], -1e30)  # ratio overflows
    frozen = copy.deepcopy(model)
    metrics = updater_for(frozen, ActorConfig(lr=1e-2, num_mini_batches=1), spec).update(inf_loss)
    assert metrics["actor/skipped_updates"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), frozen.parameters()))


def entropy_reference(model, batch, spec) -> torch.Tensor:
    """(B, R) entropy of the policy's next-token distribution at each response token, from the raw logits
    of a plain Hugging Face forward on one sample at a time (no batching, no padding)."""
    rows = []
    width = batch["responses"].shape[1]
    for i, prompt in enumerate(batch["prompt"]):
        n = int(batch["response_mask"][i].sum())
        ids = torch.cat([prompt.input_ids, batch["responses"][i, :n]])[None]
        kwargs = {k: getattr(prompt, k) for k in ("pixel_values", "image_grid_thw") if getattr(prompt, k) is not None}
        logits = model(input_ids=ids, mm_token_type_ids=torch.cat([prompt.mm_token_type_ids,
                       torch.zeros(n, dtype=torch.long)])[None], **kwargs).logits[0, len(prompt) - 1 : -1]
        logits = logits.float().index_fill(-1, torch.tensor(spec.banned_ids), float("-inf"))
        p = torch.softmax(logits, -1)
        ent = -(p * torch.log_softmax(logits, -1).masked_fill(p == 0, 0)).sum(-1)
        rows.append(torch.nn.functional.pad(ent, (0, width - n)))
    return torch.stack(rows)


def test_the_entropy_bonus_adds_minus_coef_times_the_mean_entropy(rollout_batch):
    """With actor.entropy_coeff, the gradient is that of pg_loss - coef * token-mean entropy, the entropy
    computed here from a per-sample forward, and actor/entropy_update is that mean; with coef 0 it is pg_loss's
    alone (the bonus changes it) and no entropy is logged."""
    model, batch, spec = rollout_batch
    coef = 0.5
    reference = copy.deepcopy(model).train()
    logp, _ = response_logprobs(PolicyForward(reference), batch["prompt"], batch["responses"], batch["response_mask"],
                                pad_token_id=spec.pad_token_id, banned_ids=spec.banned_ids, temperature=1.0, device=CPU)
    mask = batch["response_mask"]
    pg, _ = ppo_clip_loss(logp, batch["old_log_probs"], batch["advantages"], mask, clip_low=0.2, clip_high=0.2)
    entropy = entropy_reference(reference, batch, spec)
    (pg - coef * (entropy * mask).sum() / mask.sum()).backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 1e9)
    grads, metrics = {}, {}
    for c in (coef, 0.0):
        trained = copy.deepcopy(model)
        cfg = ActorConfig(lr=1e-2, warmup_steps=0, num_mini_batches=1, entropy_coeff=c, grad_clip=1e9)
        metrics[c] = updater_for(trained, cfg, spec).update(batch)
        grads[c] = dict(trained.named_parameters())
    for name, q in reference.named_parameters():
        assert torch.allclose(grads[coef][name].grad, q.grad, atol=1e-6, rtol=1e-4), name
    assert any(not torch.allclose(grads[0.0][n].grad, q.grad, atol=1e-6) for n, q in reference.named_parameters())
    # The entropy the bonus acts on is logged; without the bonus the update computes none and logs none.
    assert metrics[coef]["actor/entropy_update"] == pytest.approx(float((entropy.detach() * mask).sum() / mask.sum()),
                                                                  rel=1e-4)
    assert not any("entropy" in key for key in metrics[0.0])


def test_the_positive_example_lm_loss_imitates_only_the_correct_samples(rollout_batch):
    """VAPO's extra loss positive_lm (coefficient actor.loss.positive_lm.coef): with zero advantages the whole
    gradient is the NLL of the correct rows' tokens over the mini-batch's token count; rows marked wrong
    contribute nothing."""
    model, batch, spec = rollout_batch
    lm = Batch(tensors=dict(batch.tensors), objects=dict(batch.objects))
    lm.tensors["advantages"] = torch.zeros_like(batch["advantages"])
    correct = torch.tensor([float(i % 3 == 0) for i in range(len(batch))])
    lm.tensors["correct"] = correct
    reference = copy.deepcopy(model).train()
    logp, _ = response_logprobs(PolicyForward(reference), batch["prompt"], batch["responses"], batch["response_mask"],
                                pad_token_id=spec.pad_token_id, banned_ids=spec.banned_ids, temperature=1.0, device=CPU)
    mask = batch["response_mask"]
    (0.7 * -(logp * mask * correct[:, None]).sum() / mask.sum()).backward()
    trained = copy.deepcopy(model)
    cfg = ActorConfig(lr=1e-2, warmup_steps=0, num_mini_batches=1, grad_clip=1e9)
    updater = updater_for(trained, cfg, spec, ActorLoss("ppo_clip", (("positive_lm", 0.7),)))
    metrics = updater.update(lm)
    for (name, p), q in zip(trained.named_parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-7, rtol=1e-4), name
    selected = mask * correct[:, None]
    nll = float(-(logp.detach() * selected).sum() / mask.sum())
    assert metrics["actor/positive_lm_loss"] == pytest.approx(nll, rel=1e-5)
    assert metrics["actor/positive_token_frac"] == pytest.approx(float(selected.sum() / mask.sum()), rel=1e-6)
    without = Batch(tensors={k: v for k, v in lm.tensors.items() if k != "correct"}, objects=dict(lm.objects))
    with pytest.raises(KeyError, match="correct"):
        updater.update(without)
