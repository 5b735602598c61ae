"""Example reward plugin: a correct answer, minus a small penalty for long responses.

Use it from a config as ``reward: rewards/examples/length_penalty.py:score``.
It shows the dict return form: ``"score"`` is the reward used for training; the other keys are
logged as parts of the component (``reward/length_penalty.score/correct``, ...; the component is
named ``<file stem>.<function>`` because ``score`` alone would read as the total).
"""

from __future__ import annotations

from rewards.verifiers import answer_match

FREE_CHARS = 200  # responses up to this length are not penalised
PENALTY_PER_CHAR = 0.001
MAX_PENALTY = 0.5


def score(response: str, ground_truth: str) -> dict[str, float]:
    """answer_match minus 0.001 per character beyond 200, at most 0.5."""
    correct = answer_match(response, ground_truth)
    penalty = min(MAX_PENALTY, PENALTY_PER_CHAR * max(0, len(response) - FREE_CHARS))
    return {"score": correct - penalty, "correct": correct, "length_penalty": penalty}
