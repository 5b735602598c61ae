"""The per-prompt pass-rate record and the sampling rules that read it: solved prompts skipped, never-solved ones
drawn at a bounded rate, the record through a checkpoint's state, and the loader unchanged with the rules off."""

import torch

from mmrl.trainer.dataset import PromptLoader
from mmrl.trainer.pass_rates import PassRates, SamplingRules


def rows(n):
    return [{"id": f"p{i}", "messages": [{"role": "user", "content": "q"}], "images": [], "answer": "a",
             "data_source": "s", "extra": "{}"} for i in range(n)]


def test_the_record_counts_groups_streaks_and_round_trips():
    rates = PassRates()
    rates.record(["a", "a", "b", "b", "c", "c"], torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]))
    rates.record(["a", "a", "c", "c"], torch.tensor([1.0, 1.0, 0.0, 0.0]))
    a, b, c = (rates.get(u) for u in "abc")
    assert (a.groups, a.samples, a.correct, a.solved_streak, a.ever_solved) == (2, 4, 4, 2, True)
    assert (b.pass_rate, b.solved_streak, b.ever_solved) == (0.5, 0, True)
    assert (c.groups, c.pass_rate, c.ever_solved) == (2, 0.0, False)
    assert rates.metrics() == {"sampler/prompts_seen": 3.0, "sampler/prompts_always_solved": 1.0,
                               "sampler/prompts_never_solved": 1.0}
    restored = PassRates()
    restored.load_state_dict(rates.state_dict())
    assert restored == rates


def test_the_loader_skips_solved_prompts_and_revisits_unsolved_ones_at_the_rate():
    rates = PassRates()
    rates.record([f"p{i}" for i in range(10) for _ in range(2)], torch.tensor([1.0, 1.0] * 5 + [0.0, 0.0] * 5))
    rules = SamplingRules(rates, skip_solved_after=1, unsolved_revisit_rate=0.25)
    loader = PromptLoader(rows(40), 4, seed=3, rules=rules)
    drawn = [uid for _ in range(30) for uid in loader.next_batch()["uid"]]
    solved, unsolved = {f"p{i}" for i in range(5)}, {f"p{i}" for i in range(5, 10)}
    assert not solved & set(drawn)
    fresh = [u for u in drawn if u not in unsolved]
    share = sum(u in unsolved for u in drawn) / len(drawn)
    # 30 unseen prompts always drawn, 5 never-solved ones at 1/4: about 5 * 0.25 / 31.25 = 4% of the draws.
    assert 0 < share < 0.12 and len(fresh) > 0.85 * len(drawn)
    assert rules.skipped_solved > 0 and rules.skipped_unsolved > 0
    assert rules.metrics()["sampler/skipped_solved"] == float(rules.skipped_solved)


def test_with_the_rules_off_the_loader_draws_as_before():
    plain = PromptLoader(rows(10), 3, seed=5)
    off = PromptLoader(rows(10), 3, seed=5, rules=SamplingRules(PassRates()))
    assert [plain.next_batch()["uid"] for _ in range(9)] == [off.next_batch()["uid"] for _ in range(9)]


def test_a_loader_whose_rules_skip_everything_still_fills_its_batch():
    rates = PassRates()
    rates.record([f"p{i}" for i in range(6)], torch.ones(6))
    loader = PromptLoader(rows(6), 4, seed=0, rules=SamplingRules(rates, skip_solved_after=1))
    assert len(loader.next_batch()) == 4
