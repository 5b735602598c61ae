"""Built-in reward functions (verifiers) and the answer format they read.

The answer format is defined here once (:data:`ANSWER_TAG`, :func:`format_answer`): the SFT targets, the
tiny model's tokenizer corpus and every verifier use it. :func:`extract_answer` finds the model's answer
(the last ``<answer>...</answer>``, or the whole text when it has no tag).

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

The modules are ``rewards.<module>``; each one's docstring says exactly what it accepts.

No verifier raises on a ``str`` response: a malformed or hostile one (megabytes of text, unclosed or
nested tags) scores 0, in time linear in its length. A response that is not a ``str`` raises TypeError.
"""

from __future__ import annotations

import re

from rewards.text import normalize_text
from rewards.types import RewardFn

ANSWER_TAG = "answer"


def format_answer(answer: str) -> str:
    """The answer in the trained format: ``<answer>{answer}</answer>``."""
    return f"<{ANSWER_TAG}>{answer}</{ANSWER_TAG}>"


# Tags are matched case-insensitively and tolerate spaces, e.g. "< /Answer >".
_OPEN = rf"<\s*{ANSWER_TAG}\s*>"
_CLOSE = rf"<\s*/\s*{ANSWER_TAG}\s*>"
# A pair whose content holds no further opening tag: in "<answer><answer>x</answer>" it is the inner one.
_PAIR = re.compile(rf"{_OPEN}((?:(?!{_OPEN}).)*?){_CLOSE}", re.IGNORECASE | re.DOTALL)
_ONLY_PAIR = re.compile(rf"{_OPEN}(.*?){_CLOSE}", re.IGNORECASE | re.DOTALL)
_ANY_TAG = re.compile(rf"{_OPEN}|{_CLOSE}", re.IGNORECASE)
# Chat-template special tokens such as <|im_end|> or <|endoftext|>.
_SPECIAL_TOKEN = re.compile(r"<\|[^<>|]*\|>")

_QUOTES = "\"'`“”‘’"
_TRAILING_PUNCTUATION = ".!,"


def extract_answer(text: str) -> str | None:
    """The model's answer in ``text``, or None if it gave none.

    The answer is the stripped content of the last ``<answer>...</answer>``
    pair. Text with no answer tag at all is a bare answer and is returned
    stripped. Text with a tag but no complete pair (an unclosed ``<answer>``
    or a stray ``</answer>``), empty text and an empty pair give None.
    Special tokens like ``<|im_end|>`` are ignored.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer expects the response as a str, got {type(text).__name__}")
    cleaned = _SPECIAL_TOKEN.sub(" ", text)
    pairs = _PAIR.findall(cleaned)
    if pairs:
        answer = pairs[-1].strip()
    elif _ANY_TAG.search(cleaned):
        return None
    else:
        answer = cleaned.strip()
    return answer or None


def strip_trailing_special(text: str) -> str:
    """``text`` without trailing whitespace and special tokens such as ``<|im_end|>``."""
    # Index arithmetic rather than one regex anchored at the end, or slicing in the loop: both would be
    # quadratic on hostile text (a long whitespace run, thousands of special tokens).
    end = len(text)
    while True:
        while end and text[end - 1].isspace():
            end -= 1
        start = text.rfind("<|", 0, end - 2) if text.endswith("|>", 0, end) else -1
        if start < 0 or not _SPECIAL_TOKEN.fullmatch(text, start, end):
            return text[:end]
        end = start


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


# The verifier modules import extract_answer from this module, so they are imported once it is defined.
from rewards.choice import multiple_choice  # noqa: E402
from rewards.counting import count_match  # noqa: E402
from rewards.grounding import grounding_hit, grounding_iou  # noqa: E402
from rewards.math_answer import math_answer  # noqa: E402
from rewards.numeric import numeric  # noqa: E402
from rewards.shaping import overlong_penalty, think_format  # noqa: E402

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
