"""The algorithm objects of the family read the right fields and call the right estimators and filters
(the estimators themselves are checked against loop references in test_algo_family_*.py)."""

from __future__ import annotations

import pytest
import torch

from mmrl.algos import build_algorithm
from mmrl.config import load_config
from mmrl.protocol import Batch
from mmrl.algos.dapo import first_groups

LENGTHS = [3, 1, 2, 3, 2, 1]
UIDS = ["a", "a", "a", "b", "b", "c"]
SCORES = [1.0, 0.0, 1.0, 0.5, 0.5, 2.0]


def batch(**extra: torch.Tensor) -> Batch:
    mask = torch.tensor([[1.0] * n + [0.0] * (3 - n) for n in LENGTHS])
    rewards = torch.zeros(len(LENGTHS), 3)
    for i, (n, s) in enumerate(zip(LENGTHS, SCORES)):
        rewards[i, n - 1] = s
    tensors = {"token_level_rewards": rewards, "response_mask": mask, "row": torch.arange(len(LENGTHS)), **extra}
    return Batch(tensors=tensors, objects={"uid": list(UIDS)})


def algorithm(name: str, *overrides: str):
    extra = ["actor.loss_agg_mode=seq-mean-token-mean"] if name == "sppo" else []
    return build_algorithm(load_config(None, [f"algorithm.name={name}", *extra, *overrides]))


def test_dapo_drops_the_groups_whose_rewards_agree():
    kept, metrics = algorithm("dapo").filter(batch())
    assert kept["row"].tolist() == [0, 1, 2, 5]  # group b (0.5, 0.5) dropped; c is a group of one
    assert metrics == {"filter/kept_samples": 4.0, "filter/dropped_samples": 2.0}


@pytest.mark.parametrize(("mode", "k", "rows"), [("best_k", 1, [0, 3, 5]), ("best_and_worst", 1, [0, 1, 3, 4, 5])])
def test_pf_ppo_keeps_the_chosen_responses_of_each_group(mode, k, rows):
    kept, _ = algorithm("pf_ppo", f"algorithm.pf_ppo.filter_mode={mode}",
                        f"algorithm.pf_ppo.filter_k={k}").filter(batch())
    assert kept["row"].tolist() == rows


def test_sppo_gives_the_win_rates_and_as_advantage_the_win_rate_minus_a_half_on_every_token():
    out = algorithm("sppo").compute_advantages(batch())
    # a: 1 beats 0 and ties 1 -> .75; 0 loses both -> 0; b ties -> .5; c alone -> .5
    expected = [0.75, 0.0, 0.75, 0.5, 0.5, 0.5]
    assert out["win_rates"].tolist() == expected
    for i, (n, p) in enumerate(zip(LENGTHS, expected)):
        assert out["advantages"][i].tolist() == pytest.approx([p - 0.5] * n + [0.0] * (3 - n))


def test_rloo_gives_zero_to_a_group_of_one_and_to_a_group_whose_rewards_agree():
    """By hand: group a (1, 0, 1): each minus the mean of the other two, 1 - 1/2, 0 - 1, 1 - 1/2; group b
    (0.5, 0.5) agrees: 0; group c is one response: no other to compare with, 0. On every valid token."""
    adv = algorithm("rloo").compute_advantages(batch())["advantages"]
    expected = [0.5, -1.0, 0.5, 0.0, 0.0, 0.0]
    for i, (n, a) in enumerate(zip(LENGTHS, expected)):
        assert adv[i].tolist() == pytest.approx([a] * n + [0.0] * (3 - n), abs=1e-7)
    alone = Batch(tensors={"token_level_rewards": torch.tensor([[0.0, 3.0]]), "response_mask": torch.ones(1, 2)},
                  objects={"uid": ["only"]})
    assert algorithm("rloo").compute_advantages(alone)["advantages"].tolist() == [[0.0, 0.0]]


def test_remax_subtracts_the_greedy_baseline_and_dr_grpo_only_centres():
    baseline = torch.tensor([0.5, 0.5, 0.5, 1.0, 1.0, 0.0])
    adv = algorithm("remax").compute_advantages(batch(baseline_scores=baseline))["advantages"]
    for i, n in enumerate(LENGTHS):
        assert adv[i, :n].tolist() == pytest.approx([SCORES[i] - float(baseline[i])] * n)
    adv = algorithm("dr_grpo").compute_advantages(batch())["advantages"]
    assert adv[:, 0].tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3, 0.0, 0.0, 0.0], abs=1e-6)


def test_vapo_uses_a_length_adaptive_actor_lambda_and_the_critics_own():
    """Rewards on the last token, zero values: the critic's returns (lambda_critic = 1, gamma 1) are the
    score on every token; the actor's raw advantage at token t is lambda_i^(n-1-t) * score before whitening."""
    values = torch.zeros(len(LENGTHS), 3)
    out = algorithm("vapo", "algorithm.vapo.lam_alpha=0.5").compute_advantages(batch(values=values))
    for i, n in enumerate(LENGTHS):
        assert out["returns"][i, :n].tolist() == pytest.approx([SCORES[i]] * n)
    lam = [max(0.0, 1 - 1 / (0.5 * n)) for n in LENGTHS]
    raw = torch.zeros(len(LENGTHS), 3)
    for i, n in enumerate(LENGTHS):
        for t in range(n):
            raw[i, t] = lam[i] ** (n - 1 - t) * SCORES[i]
    mask = batch()["response_mask"]
    valid = raw[mask > 0]
    whitened = (raw - valid.mean()) / (valid.var() + 1e-8).sqrt() * mask
    assert torch.allclose(out["advantages"], whitened, atol=1e-5)


def test_first_groups_keeps_whole_groups_in_order():
    b = batch()
    assert first_groups(b, 2)["row"].tolist() == [0, 1, 2, 3, 4]
    assert first_groups(b, 5)["row"].tolist() == list(range(6))
