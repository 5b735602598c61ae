"""GRPO for pass@k and OPO's optimal baseline against loops: every k-subset of a group enumerated, the
length-weighted baseline summed by hand."""

import itertools
import statistics

import pytest
import torch

from mmrl.algos.opo import opo_advantages
from mmrl.algos.pass_at_k import pass_at_k_advantages
from mmrl.config import ConfigError, load_config
from mmrl.protocol import Batch
from mmrl.run_config import prepare_run_config
from mmrl.algos import build_algorithm


def subset_reference(correct, uids, k):
    """Per sample: the mean over the k-subsets of its group holding it of (the subset's best reward - R), over
    sigma, R the mean best reward over all k-subsets and sigma sqrt(R (1 - R)); 0 for a flat or small group."""
    out = [0.0] * len(uids)
    for uid in dict.fromkeys(uids):
        members = [i for i, u in enumerate(uids) if u == uid]
        subsets = list(itertools.combinations(members, k)) if len(members) >= k else []
        best = {s: max(correct[i] for i in s) for s in subsets}
        if not subsets or len({correct[i] for i in members}) == 1:
            continue
        mean = statistics.fmean(best.values())
        sigma = (mean * (1 - mean)) ** 0.5
        for i in members:
            holding = [best[s] for s in subsets if i in s]
            out[i] = (statistics.fmean(holding) - mean) / sigma
    return torch.tensor(out)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_pass_at_k_equals_the_mean_over_every_k_subset(k):
    correct = [1, 0, 0, 1, 0, 0, 0, 1] + [0, 0, 0, 0] + [1, 1, 1] + [1, 0, 0, 0, 0, 0] + [1]
    uids = ["a"] * 8 + ["b"] * 4 + ["c"] * 3 + ["d"] * 6 + ["e"]
    got = pass_at_k_advantages(torch.tensor(correct, dtype=torch.float), uids, k, epsilon=0.0)
    assert torch.allclose(got, subset_reference(correct, uids, k), atol=1e-6)
    assert torch.all(got[8:15] == 0) and got[-1] == 0  # all wrong, all right, a single sample
    if k == 1:  # pass@1 is GRPO with the population std: (r - mean) / sqrt(mean (1 - mean))
        group = torch.tensor(correct[:8], dtype=torch.float)
        assert torch.allclose(got[:8], (group - group.mean()) / group.std(unbiased=False), atol=1e-6)


def opo_reference(scores, lengths, uids):
    out = []
    for i, uid in enumerate(uids):
        members = [j for j, u in enumerate(uids) if u == uid]
        total = sum(lengths[j] for j in members)
        if len(members) < 2 or total == 0:
            out.append(0.0)
            continue
        out.append(scores[i] - sum(lengths[j] * scores[j] for j in members) / total)
    return torch.tensor(out)


def test_opo_is_the_length_weighted_group_baseline():
    scores = [1.0, 0.0, 1.2, 0.2, 0.7, 0.5, 0.1, 3.0]
    lengths = [5, 12, 1, 7, 0, 0, 4, 9]
    uids = ["a", "a", "a", "a", "b", "b", "c", "d"]
    got = opo_advantages(torch.tensor(scores), torch.tensor(lengths), uids)
    assert torch.allclose(got, opo_reference(scores, lengths, uids), atol=1e-6)
    assert torch.all(got[4:] == 0)  # empty responses' group, singletons


def test_the_algorithm_objects_broadcast_over_the_policy_tokens_and_check_k():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]], dtype=torch.float)  # a hole in the last
    batch = Batch(tensors={"correct": torch.tensor([1.0, 0.0, 0.0, 1.0]), "response_mask": torch.ones(4, 3),
                           "policy_mask": mask, "token_level_rewards": torch.tensor([[0, 1.0, 0], [0, 0, 0],
                                                                                    [0, 0, 0.5], [0, 0, 1.0]])},
                  objects={"uid": ["p", "p", "p", "p"]})
    cfg = load_config(None, ["algorithm.name=grpo_pass_k", "algorithm.grpo_pass_k.k=2", "rollout.n=4"])
    adv = build_algorithm(cfg).compute_advantages(batch)["advantages"]
    expected = pass_at_k_advantages(batch["correct"], batch["uid"], 2)
    assert torch.allclose(adv, expected.unsqueeze(-1) * mask)
    opo = build_algorithm(load_config(None, ["algorithm.name=opo"])).compute_advantages(batch)["advantages"]
    assert torch.allclose(opo, opo_advantages(torch.tensor([1.0, 0, 0.5, 1.0]), mask.sum(-1), ["p"] * 4)
                          .unsqueeze(-1) * mask)
    with pytest.raises(ConfigError, match="grpo_pass_k.k=9 exceeds rollout.n=8"):
        prepare_run_config(load_config(None, ["algorithm.name=grpo_pass_k", "algorithm.grpo_pass_k.k=9"]))
    with pytest.raises(ConfigError, match="actor.loss.cispo.clip_high .the cispo loss's.: actor.loss.policy=sapo"):
        prepare_run_config(load_config(None, ["actor.loss.policy=sapo", "actor.loss.cispo.clip_high=2"]))
