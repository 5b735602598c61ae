"""Built-in reward functions for answers written as ``<answer>...</answer>``.

The answer format is defined here once (:data:`ANSWER_TAG`, :func:`format_answer`): the SFT targets, the
tiny model's tokenizer corpus and every verifier use it.
"""

from __future__ import annotations

import re

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
_TRAILING_JUNK = re.compile(r"(?:\s|<\|[^<>|]*\|>)+\Z")

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


def normalize(text: str) -> str:
    """Lower-case, collapse whitespace, drop trailing ".!," and surrounding quotes."""
    if not isinstance(text, str):
        raise TypeError(f"normalize expects a str, got {type(text).__name__}")
    out = " ".join(text.lower().split())
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
    body = _TRAILING_JUNK.sub("", response).lstrip()
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
}
"""Verifiers shipped with mmrl, registered under these names by :mod:`rewards.registry`."""
