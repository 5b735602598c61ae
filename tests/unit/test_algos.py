import math

import pytest
import torch

from mmrl.algos import ALGORITHMS, build_algorithm
from mmrl.algos.aggregation import aggregate
from mmrl.algos.grpo import grpo_advantages
from mmrl.algos.kl import kl_penalty
from mmrl.algos.losses import LOSSES, policy_losses
from mmrl.algos.losses.ppo_clip import ppo_clip_loss
from mmrl.algos.rloo import rloo_advantages
from mmrl.config import ActorConfig, load_config
from mmrl.protocol import Batch


def test_grpo_advantages_by_hand():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 2.0])
    uids = ["a", "a", "a", "a", "b", "b", "c"]
    adv = grpo_advantages(scores, uids)
    # group a: mean 0.75, unbiased std sqrt(((.25^2)*3 + .75^2)/3) = 0.5
    assert adv[:4].tolist() == pytest.approx([0.5, -1.5, 0.5, 0.5], abs=1e-5)
    # group b: identical scores -> 0; singleton group c -> 0
    assert adv[4:].tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)


def test_grpo_without_std_is_centred_scores():
    adv = grpo_advantages(torch.tensor([3.0, 1.0, 5.0]), ["x", "x", "x"], norm_by_std=False)
    assert adv.tolist() == pytest.approx([0.0, -2.0, 2.0])


def test_rloo_by_hand():
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0]), ["g", "g", "g"])
    # 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5
    assert adv.tolist() == pytest.approx([1.0, -0.5, -0.5])


def test_grpo_matches_loop_reference():
    torch.manual_seed(0)
    scores = torch.rand(24)
    uids = [str(i % 5) for i in range(24)]
    adv = grpo_advantages(scores, uids)
    for g in set(uids):
        idx = [i for i, u in enumerate(uids) if u == g]
        vals = [float(scores[i]) for i in idx]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for i in idx:
            assert float(adv[i]) == pytest.approx((float(scores[i]) - mean) / (std + 1e-6), rel=1e-5)


def scored_batch(scores: list[float], uids: list[str], lengths: list[int], width: int = 3) -> Batch:
    """Samples with outcome rewards on their last response token, as the driver's reward stage leaves them."""
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    rewards = torch.zeros_like(mask)
    for row, (score, n) in enumerate(zip(scores, lengths)):
        rewards[row, n - 1] = score
    return Batch(tensors={"token_level_rewards": rewards, "response_mask": mask}, objects={"uid": uids})


def test_grpo_object_broadcasts_the_outcome_advantage_onto_response_tokens():
    algorithm = build_algorithm(load_config(None, ["algorithm.name=grpo"]))
    adv = algorithm.compute_advantages(scored_batch([1.0, 0.0], ["u", "u"], [2, 1]))["advantages"]
    s = 1 / math.sqrt(0.5)  # (1 - 0.5) / std where std = sqrt(0.5)
    expected = torch.tensor([[0.5 * s, 0.5 * s, 0.0], [-0.5 * s, 0.0, 0.0]])
    assert torch.allclose(adv, expected, rtol=1e-4)


def test_dr_grpo_and_rloo_objects_against_a_loop_reference():
    scores, uids, lengths = [1.0, 0.0, 0.5, 2.0, 1.0], ["a", "a", "a", "b", "b"], [3, 1, 2, 3, 3]
    batch = scored_batch(scores, uids, lengths)
    for name, overrides in (("grpo", ["algorithm.norm_adv_by_std=false"]), ("rloo", [])):
        adv = build_algorithm(load_config(None, [f"algorithm.name={name}", *overrides])).compute_advantages(batch)
        for i, (score, uid, n) in enumerate(zip(scores, uids, lengths)):
            others = [s for j, (s, u) in enumerate(zip(scores, uids)) if u == uid and j != i]
            group = others + [score]
            baseline = sum(others) / len(others) if name == "rloo" else sum(group) / len(group)
            row = adv["advantages"][i].tolist()
            assert row[:n] == pytest.approx([score - baseline] * n, abs=1e-6), (name, i)
            assert row[n:] == [0.0] * (3 - n)


def test_algorithm_declarations_and_tables():
    names = ["grpo", "dr_grpo", "rloo", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax",
             "dapo", "gspo", "vapo", "pf_ppo", "sppo", "grpo_pass_k", "opo", "otb"]
    assert sorted(ALGORITHMS) == sorted(names)
    critics = {n for n in names if ALGORITHMS[n].needs_critic}
    assert critics == {"ppo", "vapo", "pf_ppo"}
    sizes = {n: ALGORITHMS[n].min_group_size for n in ("grpo", "rloo", "ppo", "sppo", "dr_grpo", "vapo")}
    assert sizes == {"grpo": 2, "rloo": 2, "ppo": 1, "sppo": 2, "dr_grpo": 2, "vapo": 2}
    assert {n: ALGORITHMS[n].loss_fields for n in names if ALGORITHMS[n].loss_fields} == {
        "sppo": ("win_rates",), "vapo": ("correct",)}
    assert {n: ALGORITHMS[n].policy_loss for n in ("gspo", "sppo", "grpo")} == {
        "gspo": "gspo", "sppo": "sppo", "grpo": "ppo_clip"}
    assert all(ALGORITHMS[n].policy_loss in policy_losses() for n in ALGORITHMS)


def test_the_ppo_clip_table_entry_reads_the_actor_config():
    logp, old = torch.tensor([[0.5, -0.5]]), torch.zeros(1, 2)
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    cfg = ActorConfig(clip_ratio_low=0.1, clip_ratio_high=0.3, loss_agg_mode="seq-mean-token-sum")
    loss, metrics = LOSSES["ppo_clip"](logp, old, adv, mask, cfg=cfg)
    direct, _ = ppo_clip_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.3, agg_mode="seq-mean-token-sum")
    # token 0: ratio e^.5 clipped at 1.3 -> -1.3; token 1: ratio e^-.5 = .6065 vs clip .9 -> max(.6065, .9) = .9
    assert float(loss) == pytest.approx(-1.3 + 0.9, abs=1e-5) and float(loss) == float(direct)
    assert metrics["pg_clipfrac"] == 1.0


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
