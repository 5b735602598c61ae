"""Built-in reward functions (verifiers) and the answer format they read.

The answer format is defined once, in :mod:`mmrl.answer_format` (:data:`ANSWER_TAG`, :func:`format_answer`,
:func:`extract_answer`, which finds the model's answer: the last ``<answer>...</answer>``, or the whole text
when it has no tag); this module re-exports them.

:data:`BUILTINS` lists the verifiers :mod:`rewards.registry` registers by name:

================  ==========================================  ===========================================
name              checks (module)                             score
================  ==========================================  ===========================================
answer_match      the answer equals the ground truth (here)   1/0; Unicode-normalised, case-insensitive
format            exactly one ``<answer>`` pair (here)        1/0
multiple_choice   one option letter, ``(B)`` (choice)         1/0; naming several options scores 0
numeric           one number within tolerance (numeric)       1/0; ``extra["rel_tol"]``/``["abs_tol"]``
math              math equivalence (math_answer)              1/0; math-verify: ``1/2`` equals ``0.5``
count             one whole count, "3" or "three" (counting)  1/0
grounding_iou     IoU of the answer's box (grounding)         IoU in [0, 1]; parts ``iou``, ``hit``
grounding_hit     the box's IoU >= 0.5 (grounding)            1/0; part ``iou``
think_format      ``<think>..</think><answer>..</answer>``    1/0
                  (shaping)
overlong_penalty  DAPO's soft overlong punishment (shaping)   0, falling to -1 at ``max_response_tokens``
================  ==========================================  ===========================================

The modules are ``rewards.<module>``; each one's docstring says exactly what it accepts. They read the answer
with :mod:`mmrl.answer_format` and share the text helpers of :mod:`rewards.text`, never this module, which
only gathers them.

No verifier raises on a ``str`` response: a malformed or hostile one (megabytes of text, unclosed or
nested tags) scores 0, in time linear in its length. A response that is not a ``str`` raises TypeError.
"""

from __future__ import annotations

from mmrl.answer_format import ANSWER_TAG, extract_answer, format_answer  # noqa: F401  (re-exported)
from mmrl.answer_format import ANY_TAG as _ANY_TAG, ONLY_PAIR as _ONLY_PAIR
from rewards.choice import multiple_choice
from rewards.counting import count_match
from rewards.grounding import grounding_hit, grounding_iou
from rewards.math_answer import math_answer
from rewards.numeric import numeric
from rewards.shaping import overlong_penalty, think_format
from rewards.text import normalize_text, strip_trailing_special
from rewards.types import RewardFn

_QUOTES = "\"'`“”‘’"
_TRAILING_PUNCTUATION = ".!,"


def normalize(text: str) -> str:
    """:func:`rewards.text.normalize_text` (Unicode forms, spaces, case), then drop trailing ".!," and
    surrounding quotes."""
    if not isinstance(text, str):
        raise TypeError(f"normalize expects a str, got {type(text).__name__}")
    out = normalize_text(text)
    previous = None
    # Repeat because quotes and punctuation can nest either way: '"red".' and '"red."'.
    while out != previous:
        previous = out
        out = out.rstrip(_TRAILING_PUNCTUATION).strip(_QUOTES).strip()
    return out


def answer_match(response: str, ground_truth: str) -> float:
    """1.0 if the extracted answer equals the ground truth after normalising, else 0.0."""
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    return 1.0 if normalize(answer) == normalize(ground_truth) else 0.0


def format_reward(response: str) -> float:
    """1.0 if the response is exactly one non-empty ``<answer>...</answer>``, else 0.0.

    Trailing special tokens and whitespace (``<|im_end|>``, newlines) and
    leading whitespace are allowed; any other text outside the pair is not.
    """
    if not isinstance(response, str):
        raise TypeError(f"format_reward expects the response as a str, got {type(response).__name__}")
    body = strip_trailing_special(response).lstrip()
    match = _ONLY_PAIR.fullmatch(body)
    if match is None:
        return 0.0
    content = match.group(1)
    if _ANY_TAG.search(content) or not content.strip():
        return 0.0
    return 1.0


BUILTINS: dict[str, RewardFn] = {
    "answer_match": answer_match,
    "format": format_reward,
    "multiple_choice": multiple_choice,
    "numeric": numeric,
    "math": math_answer,
    "count": count_match,
    "grounding_iou": grounding_iou,
    "grounding_hit": grounding_hit,
    "think_format": think_format,
    "overlong_penalty": overlong_penalty,
}
"""Verifiers shipped with mmrl, registered under these names by :mod:`rewards.registry`."""
