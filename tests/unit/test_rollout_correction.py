"""The rollout correction: truncated importance weights against a plain loop, the update that applies them against a
loss whose per-token terms are weighted directly, and the config rules around them."""

import copy
import math

import pytest
import torch

from mmrl.algos.aggregation import aggregate
from mmrl.algos.losses.ppo_clip import ppo_clip_loss
from mmrl.algos.rollout_correction import IS_WEIGHTS, rollout_is_weights
from mmrl.config import ActorConfig, ConfigError, load_config
from mmrl.models.forward import PolicyForward
from mmrl.models.logprobs import response_logprobs
from mmrl.run_config import prepare_run_config
from mmrl.trainer.old_log_probs import old_log_prob_source
from tests.unit.test_actor_update import CPU, rollout_batch, updater_for  # noqa: F401 (a fixture)


def loop_weights(old, rollout, mask, mode, cap):
    """The weights written out token by token."""
    rows, cols = old.shape
    out = [[1.0] * cols for _ in range(rows)]
    for i in range(rows):
        total = sum(float(old[i, t] - rollout[i, t]) for t in range(cols) if mask[i, t])
        for t in range(cols):
            if mask[i, t]:
                log_w = total if mode == "sequence" else float(old[i, t] - rollout[i, t])
                out[i][t] = min(math.exp(log_w), cap)
    return torch.tensor(out)


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_weights_equal_a_loop_on_a_ragged_batch_with_holes(mode):
    torch.manual_seed(0)
    old, rollout = torch.randn(5, 7) * 0.4 - 1, torch.randn(5, 7) * 0.4 - 1
    mask = torch.ones(5, 7)
    mask[0, 4:] = 0  # a short response
    mask[1, 2:4] = 0  # a hole (a tool's tokens)
    mask[3] = 0  # a padding row: no policy token
    for cap in (1.0, 1.5, 100.0):
        weights, metrics = rollout_is_weights(old, rollout, mask, mode, cap)
        expected = loop_weights(old, rollout, mask, mode, cap)
        assert torch.allclose(weights, expected, atol=1e-6), (mode, cap)
        if mode == "token":
            kept = expected[mask.bool()]
        else:  # one weight per sequence (on each of its tokens): its first policy token's
            kept = torch.stack([expected[i][mask[i].bool()][0] for i in range(5) if mask[i].any()])
        assert metrics["rollout_is_mean"] == pytest.approx(float(kept.mean()), abs=1e-6)
        assert metrics["rollout_is_max"] == pytest.approx(float(kept.max()), abs=1e-6) and kept.max() <= cap
        assert metrics["rollout_is_truncated"] == pytest.approx(float((kept >= cap - 1e-7).float().mean()))
    on_policy, metrics = rollout_is_weights(old, old.clone(), mask, mode, 2.0)
    assert torch.equal(on_policy, torch.ones_like(on_policy)) and metrics["rollout_is_truncated"] == 0.0
    with pytest.raises(ValueError, match="rollout_is_cap"):
        rollout_is_weights(old, rollout, mask, mode, 0.5)
    assert rollout_is_weights(old, rollout, torch.zeros(5, 7), mode, 2.0)[1] == {}


def test_the_update_weights_each_tokens_policy_gradient_term(rollout_batch):
    """PolicyUpdater with rollout_is_weights gives the gradients of the PPO loss whose per-token terms are
    multiplied by the weights, written out directly (the clipped and dual-clipped cases included)."""
    model, batch, spec = rollout_batch
    torch.manual_seed(3)
    weighted = copy.copy(batch)
    weighted.tensors = dict(batch.tensors)
    mask = batch["response_mask"]
    weighted.tensors[IS_WEIGHTS] = (torch.rand(mask.shape) * 1.5 + 0.25) * mask + (1 - mask)
    # Old log-probs away from the current ones, so that some tokens are clipped.
    weighted.tensors["old_log_probs"] = batch["old_log_probs"] + torch.randn(mask.shape) * 0.3 * mask
    cfg = ActorConfig(lr=1e-2, warmup_steps=0, num_mini_batches=1, micro_batch_size=5, grad_clip=1e9)

    reference = copy.deepcopy(model).train()
    logp, _ = response_logprobs(PolicyForward(reference), batch["prompt"], batch["responses"], mask,
                                pad_token_id=spec.pad_token_id, banned_ids=spec.banned_ids, temperature=1.0, device=CPU)
    ratio = torch.exp(logp - weighted["old_log_probs"])
    adv = batch["advantages"]
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high))
    loss = aggregate(per_token * weighted[IS_WEIGHTS], mask, "token-mean")
    loss.backward()

    trained = copy.deepcopy(model)
    metrics = updater_for(trained, cfg, spec).update(weighted)
    assert metrics["actor/pg_clipfrac"] > 0  # the clipped branch is exercised
    for (name, p), q in zip(trained.named_parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-7, rtol=1e-4), name
    plain = copy.deepcopy(model)
    updater_for(plain, cfg, spec).update(batch)
    assert not all(torch.allclose(p.grad, q.grad) for p, q in zip(plain.parameters(), trained.parameters()))


def test_a_positive_weight_on_the_advantage_is_a_weight_on_the_clipped_term():
    """The identity the updater relies on, for PPO's clipped and dual-clipped losses."""
    torch.manual_seed(1)
    logp, old = torch.randn(4, 6), torch.randn(4, 6)
    adv, w, mask = torch.randn(4, 6), torch.rand(4, 6) + 0.1, torch.ones(4, 6)
    for c in (None, 3.0):
        scaled, _ = ppo_clip_loss(logp, old, adv * w, mask, clip_low=0.2, clip_high=0.28, clip_ratio_c=c,
                                  agg_mode="seq-mean-token-sum")
        ratio = torch.exp(logp - old)
        term = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
        if c is not None:
            term = torch.where(adv < 0, torch.minimum(term, -adv * c), term)
        assert torch.allclose(scaled, (term * w).sum(-1).mean(), atol=1e-6)


def test_config_rules():
    assert old_log_prob_source(load_config(None, ["actor.num_mini_batches=1"])) == "update"
    corrected = load_config(None, ["actor.num_mini_batches=1", "actor.rollout_correction=token"])
    assert old_log_prob_source(corrected) == "recompute"  # the weights need the trainer's own old log-probs
    with pytest.raises(ConfigError, match="sppo loss does not scale"):
        prepare_run_config(load_config(None, ["algorithm.name=sppo", "actor.loss_agg_mode=seq-mean-token-mean",
                                              "actor.rollout_correction=sequence"]))
    for name, reason in (("dapo", "dynamic sampling"), ("remax", "greedy baseline")):
        with pytest.raises(ConfigError, match=reason):
            prepare_run_config(load_config(None, [f"algorithm.name={name}", "trainer.mode=async"]))
    prepare_run_config(load_config(None, ["trainer.mode=async", "rollout.agent.enabled=true"]))  # episodes too
    prepare_run_config(load_config(None, ["trainer.mode=async", "algorithm.name=pf_ppo"]))  # a filter is fine
    for args, reason in ((["rollout.partial=true"], "trainer.mode=sync"),
                         (["rollout.partial=true", "trainer.mode=async", "rollout.engine=vllm"], "only the hf engine")):
        with pytest.raises(ConfigError, match=reason):
            prepare_run_config(load_config(None, args))
    prepare_run_config(load_config(None, ["trainer.mode=async", "rollout.partial=true", "rollout.agent.enabled=true"]))
