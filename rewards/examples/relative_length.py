"""Example batched reward plugin: a correct answer, minus a penalty for being longer than its batch's median.

Use it from a config as ``reward.function: rewards/examples/relative_length.py:score``. Being
:func:`rewards.batched`, it is called once per chunk of samples with a list per keyword, which it
needs here to compare each response with the others. ``max_penalty`` shows a data-row column taken
as a keyword: a row with a ``max_penalty`` column overrides the default for its samples.
"""

from __future__ import annotations

import statistics

from rewards import answer_match, batched

DEFAULT_MAX_PENALTY = 0.2


@batched
def score(
    response: list[str],
    ground_truth: list[str],
    response_tokens: list[int],
    max_penalty: list[float] = DEFAULT_MAX_PENALTY,  # type: ignore[assignment]
) -> list[dict[str, float]]:
    """answer_match minus max_penalty * (how far past the chunk's median length, relative to it), capped.

    A row without a ``max_penalty`` column gets the default: each entry of the list is per sample.
    """
    median = statistics.median(response_tokens) or 1
    results = []
    for text, truth, tokens, cap in zip(response, ground_truth, response_tokens, max_penalty):
        correct = answer_match(text, truth)
        penalty = min(cap, cap * max(0.0, tokens - median) / median)
        results.append({"score": correct - penalty, "correct": correct, "length_penalty": penalty})
    return results
