import math

import pytest
import torch

from mmrl.algos.advantages import AdvantageOptions, compute_advantages, grpo_advantages, rloo_advantages
from mmrl.algos.losses import aggregate, kl_penalty, ppo_clip_loss

OPTS = AdvantageOptions(norm_adv_by_std=True, epsilon=1e-6)


def test_grpo_advantages_by_hand():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 2.0])
    uids = ["a", "a", "a", "a", "b", "b", "c"]
    adv = grpo_advantages(scores, uids, OPTS)
    # group a: mean 0.75, unbiased std sqrt(((.25^2)*3 + .75^2)/3) = 0.5
    assert adv[:4].tolist() == pytest.approx([0.5, -1.5, 0.5, 0.5], abs=1e-5)
    # group b: identical scores -> 0; singleton group c -> 0
    assert adv[4:].tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)


def test_grpo_without_std_is_centred_scores():
    adv = grpo_advantages(torch.tensor([3.0, 1.0, 5.0]), ["x", "x", "x"], AdvantageOptions(norm_adv_by_std=False))
    assert adv.tolist() == pytest.approx([0.0, -2.0, 2.0])


def test_rloo_by_hand():
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0]), ["g", "g", "g"], OPTS)
    # 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5
    assert adv.tolist() == pytest.approx([1.0, -0.5, -0.5])


def test_grpo_matches_loop_reference():
    torch.manual_seed(0)
    scores = torch.rand(24)
    uids = [str(i % 5) for i in range(24)]
    adv = grpo_advantages(scores, uids, OPTS)
    for g in set(uids):
        idx = [i for i, u in enumerate(uids) if u == g]
        vals = [float(scores[i]) for i in idx]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for i in idx:
            assert float(adv[i]) == pytest.approx((float(scores[i]) - mean) / (std + 1e-6), rel=1e-5)


def test_compute_advantages_broadcasts_onto_response_tokens():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = compute_advantages("grpo", torch.tensor([1.0, 0.0]), ["u", "u"], mask, OPTS)
    s = 1 / math.sqrt(0.5)  # (1 - 0.5) / std where std = sqrt(0.5)
    expected = torch.tensor([[0.5 * s, 0.5 * s, 0.0], [-0.5 * s, 0.0, 0.0]])
    assert torch.allclose(adv, expected, rtol=1e-4)
    with pytest.raises(ValueError, match="allowed: grpo, rloo"):
        compute_advantages("nope", torch.zeros(2), ["u", "u"], mask, OPTS)


def test_ppo_clip_loss_by_hand():
    # ratios e^{0.5}=1.6487 (clipped at 1.2 for A>0), e^{-0.5}=0.6065 (clipped at 0.8 for A<0... takes max)
    logp = torch.tensor([[0.5, -0.5, 0.0]])
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    # token 0: max(-1.6487, -1.2) = -1.2 (clipped); token 1: max(0.6065, 0.8) = 0.8 (clipped)
    assert float(loss) == pytest.approx((-1.2 + 0.8) / 2, abs=1e-5)
    assert metrics["pg_clipfrac"] == pytest.approx(1.0)
    assert metrics["ppo_kl"] == pytest.approx(0.0)  # mean(old - logp) over the two valid tokens


def test_ppo_clip_loss_unclipped_gradient_is_minus_advantage():
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, metrics = ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([[2.0, -1.0]]), torch.ones(1, 2),
                                  clip_low=0.2, clip_high=0.3)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.0, 0.5])  # -A * ratio / num_tokens at ratio 1
    assert metrics["pg_clipfrac"] == 0.0


def test_aggregate_modes_by_hand():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert float(aggregate(v, m, "token-mean")) == pytest.approx(10 / 4)
    assert float(aggregate(v, m, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    assert float(aggregate(v, m, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate(v, m, "token-mean", denominator=8)) == pytest.approx(10 / 8)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate(v, m, "bogus")


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([0.0, -1.0]), torch.tensor([-1.0, -1.0])
    assert kl_penalty(logp, ref, "k1").tolist() == pytest.approx([1.0, 0.0])
    assert kl_penalty(logp, ref, "k2").tolist() == pytest.approx([0.5, 0.0])
    assert kl_penalty(logp, ref, "k3").tolist() == pytest.approx([math.exp(-1) + 1 - 1, 0.0])
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(logp, ref, "k9")
