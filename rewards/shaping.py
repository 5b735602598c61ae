"""Reward shaping that does not look at correctness: the reasoning format and the response length.

``think_format`` rewards the reasoning layout ``<think>...</think><answer>...</answer>``.
``overlong_penalty`` is DAPO's soft overlong punishment (Yu et al. 2025, "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale"): 0 up to ``max_response_tokens - cache`` tokens, then falling
linearly to -1 at ``max_response_tokens``. Both are meant to be added to a correctness verifier with
``reward.weights``.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping

from mmrl.answer_format import ANSWER_TAG
from rewards.text import strip_trailing_special

# Tolerant like the answer tags of mmrl.answer_format: any case, spaces inside ("< /Think >").
_TAG = re.compile(rf"<\s*(/?)\s*(think|{ANSWER_TAG})\s*>", re.IGNORECASE)
_LAYOUT = [("", "think"), ("/", "think"), ("", ANSWER_TAG), ("/", ANSWER_TAG)]


def think_format(response: str) -> float:
    """1.0 if the response is exactly ``<think>...</think>`` then ``<answer>...</answer>``, else 0.0.

    Both parts must be non-empty and hold no further think or answer tag. Whitespace may come before,
    between and after the parts, and special tokens such as ``<|im_end|>`` after them; nothing else.
    """
    if not isinstance(response, str):
        raise TypeError(f"think_format expects the response as a str, got {type(response).__name__}")
    body = strip_trailing_special(response).lstrip()
    tags = []
    for tag in _TAG.finditer(body):
        tags.append(tag)
        if len(tags) > len(_LAYOUT):
            return 0.0
    if [(tag[1], tag[2].lower()) for tag in tags] != _LAYOUT:
        return 0.0
    open_think, close_think, open_answer, close_answer = tags
    if open_think.start() != 0 or close_answer.end() != len(body):
        return 0.0
    if body[close_think.end() : open_answer.start()].strip():
        return 0.0
    think = body[open_think.end() : close_think.start()]
    answer = body[open_answer.end() : close_answer.start()]
    return 1.0 if think.strip() and answer.strip() else 0.0


def overlong_penalty(
    response_tokens: int = 0, max_response_tokens: int = 0, extra: Mapping | None = None
) -> float:
    """DAPO's soft overlong punishment of a response of ``response_tokens`` tokens.

    With ``L_max = max_response_tokens`` and ``cache = extra["overlong_cache"]`` (default
    ``max(1, L_max // 4)``): 0 for ``L <= L_max - cache``, ``(L_max - cache - L) / cache`` up to
    ``L_max``, -1 beyond. 0 when ``max_response_tokens`` is 0 (unknown).
    """
    length = _count(response_tokens, "response_tokens")
    max_length = _count(max_response_tokens, "max_response_tokens")
    if max_length == 0:
        return 0.0
    cache = _overlong_cache(extra, max_length)
    free = max_length - cache
    if length <= free:
        return 0.0
    if length <= max_length:
        return (free - length) / cache
    return -1.0


def _count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"overlong_penalty: {name} must be an int >= 0, got {value!r}")
    return int(value)


def _overlong_cache(extra: Mapping | None, max_length: int) -> float:
    value = None if extra is None else extra.get("overlong_cache")
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    # A data set where only some rows set it has None or NaN in the others.
    if value is None or (is_number and math.isnan(value)):
        return float(max(1, max_length // 4))
    if not is_number or not 0 < value <= max_length:
        raise ValueError(
            f"overlong_penalty: extra['overlong_cache'] must be a number of tokens in (0, "
            f"max_response_tokens={max_length}], got {value!r}"
        )
    return float(value)
