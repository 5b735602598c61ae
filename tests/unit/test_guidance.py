"""Off-policy guidance (trainer.guide_unsolved): which groups get a guide, what the guide's sample holds, and the
behaviour log-probs that give it importance weight 1."""

import pytest
import torch

from mmrl.algos.rollout_correction import rollout_is_weights
from mmrl.answer_format import extract_answer
from mmrl.config import ConfigError, load_config
from mmrl.protocol import Batch
from mmrl.run_config import prepare_run_config
from mmrl.trainer.guidance import GUIDED, Guidance, all_wrong_groups, fill_behaviour

EOS = 0


def encode(text: str) -> torch.Tensor:
    """A stand-in tokenizer: one id per character (its code), then the end-of-turn token."""
    return torch.tensor([ord(c) for c in text] + [EOS])


def verify(rows: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores 2 for a right answer, -1 for a wrong one; right when the extracted answer is the row's."""
    right = torch.tensor([float(extract_answer(t) == a) for t, a in zip(rows["response_text"], rows["answer"])])
    return 3 * right - 1, right


def scored_batch(width: int = 40) -> tuple[Batch, torch.Tensor, torch.Tensor]:
    """Three groups of three: g0 all wrong, g1 one right, g2 all wrong with a guide of its own in ``extra``."""
    uids = ["g0"] * 3 + ["g1"] * 3 + ["g2"] * 3
    texts = ["blue", "green", "<answer>blue</answer>", "<answer>red</answer>", "x", "y", "a", "b", "c"]
    answers = ["red"] * 3 + ["red"] * 3 + ["7"] * 3
    extra = [{}] * 6 + [{"guide": "I count them: <answer>7</answer>"}] * 3
    b = len(uids)
    responses = torch.randint(1, 100, (b, width))
    mask = torch.ones(b, width)
    mask[:, 10:] = 0
    batch = Batch(tensors={"responses": responses, "response_mask": mask, "policy_mask": mask.clone(),
                           "rollout_log_probs": -torch.rand(b, width)},
                  objects={"uid": uids, "response_text": texts, "answer": answers, "extra": extra})
    scores, correct = verify(batch)
    return batch, scores, correct


def test_all_wrong_groups_are_the_groups_with_no_right_sample_of_two_or_more():
    correct = torch.tensor([0, 0, 1, 0, 0, 0, 0])
    assert all_wrong_groups(["a", "a", "b", "b", "c", "c", "d"], correct) == [[0, 1], [4, 5]]  # d: alone, no group


def test_each_all_wrong_group_s_last_sample_becomes_its_guide():
    batch, scores, correct = scored_batch()
    before = batch["responses"].clone()
    out, new_scores, new_correct, metrics = Guidance(encode).apply(batch, scores, correct, verify)
    assert out[GUIDED].tolist() == [0, 0, 1, 0, 0, 0, 0, 0, 1]
    for row, text in ((2, "<answer>red</answer>"), (8, "I count them: <answer>7</answer>")):
        ids = encode(text)
        assert torch.equal(out["responses"][row, : len(ids)], ids) and not out["responses"][row, len(ids):].any()
        assert out["response_mask"][row].tolist() == [1.0] * len(ids) + [0.0] * (40 - len(ids))
        assert torch.equal(out["policy_mask"][row], out["response_mask"][row])
        assert out["response_text"][row] == text and new_correct[row] == 1 and new_scores[row] == 2
    others = [r for r in range(9) if r not in (2, 8)]
    assert torch.equal(out["responses"][others], before[others])
    assert torch.equal(new_scores[others], scores[others]) and torch.equal(new_correct[others], correct[others])
    assert metrics == {"guide/groups": 2 / 3, "guide/rejected": 0.0, "guide/too_long": 0.0}


def test_a_guide_the_verifier_refuses_or_that_does_not_fit_is_not_used():
    batch, scores, correct = scored_batch()
    batch.objects["extra"] = [{}] * 6 + [{"guide": "<answer>8</answer>"}] * 3  # wrong: the answer is 7
    out, _, new_correct, metrics = Guidance(encode).apply(batch, scores, correct, verify)
    assert out[GUIDED].tolist() == [0, 0, 1] + [0] * 6 and new_correct[8] == 0
    assert out["response_text"][8] == "c" and metrics["guide/rejected"] == 1
    narrow, scores, correct = scored_batch(width=8)  # "<answer>red</answer>" and its end token: 21 tokens
    out, *_, metrics = Guidance(encode).apply(narrow, scores, correct, verify)
    assert not out[GUIDED].any() and metrics["guide/too_long"] == 2
    batch, scores, correct = scored_batch()
    batch.objects["extra"] = [{}] * 6 + [{"guide": ["a call", "<answer>7</answer>"]}] * 3  # an agent episode's turns
    with pytest.raises(ValueError, match="row g2: extra\\['guide'\\] lists 2 turns, but the run's rollouts are single-turn"):
        Guidance(encode).apply(batch, scores, correct, verify)


def test_a_guide_s_behaviour_log_probs_are_the_old_ones_so_its_weight_is_one():
    batch, scores, correct = scored_batch()
    out, *_ = Guidance(encode).apply(batch, scores, correct, verify)
    out.tensors["old_log_probs"] = -torch.rand(9, 40)
    engine = out["rollout_log_probs"].clone()
    fill_behaviour(out)
    guided = out[GUIDED] > 0.5
    assert torch.equal(out["rollout_log_probs"][guided], out["old_log_probs"][guided])
    assert torch.equal(out["rollout_log_probs"][~guided], engine[~guided])
    weights, _ = rollout_is_weights(out["old_log_probs"], out["rollout_log_probs"], out["policy_mask"], "token", 2.0)
    assert torch.equal(weights[guided], torch.ones_like(weights[guided]))


def test_guidance_config_rules():
    prepare_run_config(load_config(None, ["trainer.guide_unsolved=true"]))
    prepare_run_config(load_config(None, ["trainer.guide_unsolved=true", "rollout.agent.enabled=true"]))
    with pytest.raises(ConfigError, match="a guide episode runs its tools on the rank that holds the prompt"):
        prepare_run_config(load_config(None, ["trainer.guide_unsolved=true", "rollout.agent.enabled=true",
                                              "trainer.mode=async"]))
    with pytest.raises(ConfigError, match="a guide has no engine log-probs"):
        prepare_run_config(load_config(None, ["trainer.guide_unsolved=true", "actor.old_log_probs=rollout"]))
