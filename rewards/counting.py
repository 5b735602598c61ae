"""Counting answers ("How many circles?"): one whole number, in digits or words.

The count may be written in digits (``3``, ``1,000``) or as an English word from ``zero`` to ``twenty``
in any case, with text around it (``3 circles``, ``Three.``). Repeating the count is fine
(``three (3)``); an answer mentioning several different numbers scores 0, even when one of them is
incidental (``3 circles, one of them red``). Negative numbers, fractions (``2.5``) and percentages
score 0; ``3.0`` counts as 3.
"""

from __future__ import annotations

import math
import re

from mmrl.answer_format import extract_answer
from rewards.numeric import find_numbers
from rewards.text import normalize_text

NUMBER_WORDS: dict[str, int] = {
    word: value
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
}
_NUMBER_WORD = re.compile(rf"\b(?:{'|'.join(NUMBER_WORDS)})\b")


def single_count(text: str) -> int | None:
    """The one count ``text`` states, or None if it states none, several, or one that is not a count."""
    text = normalize_text(text)
    values: set[float] = set()
    for value, percent in find_numbers(text):
        if percent:
            return None
        values.add(value)
    values.update(NUMBER_WORDS[word] for word in _NUMBER_WORD.findall(text))
    if len(values) != 1:
        return None
    value = values.pop()
    if not math.isfinite(value) or value < 0 or value != int(value):
        return None
    return int(value)


def count_match(response: str, ground_truth: str) -> float:
    """1.0 if the answer states one count equal to the ground truth's (``"3"`` or ``"three"``), else 0.0."""
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    count = single_count(answer)
    return 1.0 if count is not None and count == single_count(ground_truth) else 0.0
