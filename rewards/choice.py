"""Multiple-choice answers: the answer must name exactly one option letter.

Accepted spellings of option B (case-insensitive letter): ``B``, ``(B)``, ``[B]``, ``B.``, ``b)``,
``B:``, ``**B**``, ``\\boxed{B}``, with an optional lead-in such as ``Option B``, ``answer: B`` or
``The answer is (B)``. A delimited letter may be followed by the option's text: ``B. the cat``,
``(B) A cat``.

An answer that names several options scores 0: ``A or B``, ``A, C``, ``(A) (B)``, ``A. or B``. In the
text after a letter, another option counts as named when it is a bracketed letter (``(C)``), a letter
followed by ``)``, or a standalone capital letter at the end or before punctuation (``... or C.``). So
an option text ending in a capital letter, ``B. vitamin C``, scores 0 too: the verifier prefers
rejecting a rare honest answer to rewarding a hedge.
"""

from __future__ import annotations

import re

from mmrl.answer_format import extract_answer
from rewards.text import clean_text

_LEAD_IN = re.compile(
    r"(?:the\s+)?(?:(?:correct|final|right|best)\s+)?(?:answer|option|choice)\b\s*(?:is\b\s*)?[:\-]?\s*",
    re.IGNORECASE,
)
_BOXED = re.compile(r"\\boxed\{(.*)\}", re.DOTALL)
_WRAPPERS = "*\"'`“”‘’"
# The letter, bracketed or bare, then either the end or a delimiter and the option's text.
_LETTER = re.compile(
    r"(?:\(\s*(?P<p>[A-Za-z])\s*\)|\[\s*(?P<b>[A-Za-z])\s*\]|(?P<l>[A-Za-z])(?=[.:)]|\s*\Z))"
    r"\s*[.:)]?(?P<rest>.*)",
    re.DOTALL,
)
# Another option named in the text after the letter: "(C)", "c)", or a capital letter before punctuation.
_OTHER_OPTION = re.compile(
    r"(?<![A-Za-z0-9])"
    r"(?:[(\[]\s*(?P<a>[A-Za-z])\s*[)\]]|(?P<b>[A-Za-z])\)|(?P<c>[A-Z])(?=\s*(?:[.,;:!?]|\Z)))"
)


def choice_letter(text: str) -> str | None:
    """The single option letter ``text`` names, upper-cased, or None if it names none or several."""
    text = _unwrap(clean_text(text))
    for _ in range(2):  # "Answer: Option B" has two lead-ins
        lead_in = _LEAD_IN.match(text)
        if lead_in:
            text = _unwrap(text[lead_in.end():])
    match = _LETTER.fullmatch(text)
    if match is None:
        return None
    letter = (match["p"] or match["b"] or match["l"]).upper()
    for other in _OTHER_OPTION.finditer(match["rest"]):
        if (other["a"] or other["b"] or other["c"]).upper() != letter:
            return None
    return letter


def _unwrap(text: str) -> str:
    """``text`` without surrounding quotes or markdown bold, and out of ``\\boxed{...}``."""
    text = text.strip().strip(_WRAPPERS).strip()
    boxed = _BOXED.fullmatch(text)
    return boxed[1].strip() if boxed else text


def multiple_choice(response: str, ground_truth: str) -> float:
    """1.0 if the answer names exactly one option letter and it is the ground truth's, else 0.0.

    ``ground_truth`` is a letter such as ``"B"`` or ``"(B)"``; see the module docstring for what an
    answer may look like.
    """
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    letter = choice_letter(answer)
    return 1.0 if letter is not None and letter == choice_letter(ground_truth) else 0.0
