"""The answer format the policy is trained to give, ``<answer>X</answer>``: writing it and reading it.

One definition for everything that writes or reads an answer: the SFT targets (:mod:`mmrl.trainer.sft`), the
tiny model's tokenizer corpus, the synthetic preference pairs (``data_prep``) and every verifier
(``rewards``).
"""

from __future__ import annotations

import re

ANSWER_TAG = "answer"

# Tags are matched case-insensitively and tolerate spaces, e.g. "< /Answer >".
_OPEN = rf"<\s*{ANSWER_TAG}\s*>"
_CLOSE = rf"<\s*/\s*{ANSWER_TAG}\s*>"
ANSWER_PAIR = re.compile(rf"{_OPEN}((?:(?!{_OPEN}).)*?){_CLOSE}", re.IGNORECASE | re.DOTALL)
"""An opening and a closing tag whose content holds no further opening tag (in ``<answer><answer>x</answer>``
the inner pair); group 1 is the content."""
ONLY_PAIR = re.compile(rf"{_OPEN}(.*?){_CLOSE}", re.IGNORECASE | re.DOTALL)
"""An opening tag, the content (group 1), the first closing tag after it; for ``fullmatch``."""
ANY_TAG = re.compile(rf"{_OPEN}|{_CLOSE}", re.IGNORECASE)
"""Either tag."""
SPECIAL_TOKEN = re.compile(r"<\|[^<>|]*\|>")
"""A chat-template special token such as ``<|im_end|>`` or ``<|endoftext|>`` (not part of an answer)."""


def format_answer(answer: str) -> str:
    """The answer in the trained format: ``<answer>{answer}</answer>``."""
    return f"<{ANSWER_TAG}>{answer}</{ANSWER_TAG}>"


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
    cleaned = SPECIAL_TOKEN.sub(" ", text)
    pairs = ANSWER_PAIR.findall(cleaned)
    if pairs:
        answer = pairs[-1].strip()
    elif ANY_TAG.search(cleaned):
        return None
    else:
        answer = cleaned.strip()
    return answer or None
