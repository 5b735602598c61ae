"""Synthetic preference pairs for reward-model training: (prompt, chosen response, rejected response).

The pairs file's format and reading are the library's (:mod:`mmrl.trainer.preference_pairs`); :func:`write_pairs`
writes one. :func:`synthetic_pairs` makes pairs from labelled prompt rows (the demo tasks): the chosen
response is the right answer in the trained format; the rejected one is

* ``wrong_answer`` (half the pairs): another answer of the same data source, in the trained format;
* ``mangled`` (3 in 10): an answer a policy drifts to under a reward model, in the trained format: the right
  answer doubled or glued to a wrong one, cut short, or with junk characters;
* ``bad_format`` (the rest): the right answer in a broken format: no tags, an unclosed tag, two answers, or
  (half of them) one character of a tag deleted, replaced or added.

Without the mangled and the tag-edited ones, GRPO on a reward model trained on the demo task learns to
answer ``blueblue``, ``<answer>\x10answer>`` or ``</answer>orange</answer>``: the reward model had never seen
such answers and scored them highest.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mmrl.answer_format import ANSWER_TAG, format_answer
from mmrl.trainer.preference_pairs import PreferencePair

KIND_SHARES = {"wrong_answer": 0.45, "mangled": 0.25, "bad_format": 0.3}
TAG_EDITS = "</>"
JUNK = "\x10#*~_<>/"


def broken_formats(answer: str) -> list[str]:
    """The right answer written in ways the trained format does not allow."""
    tag = format_answer(answer)
    return [answer, tag[: -len(f"</{ANSWER_TAG}>")], f"{tag}{tag}", tag.replace(ANSWER_TAG, ANSWER_TAG[:3]),
            format_answer("")]


def corrupt_tag(answer: str, rng: random.Random) -> str:
    """The right answer in the trained format with one character of a tag deleted, replaced or added
    (``answer>red</answer>``, ``</answer>red</answer>``, ...): the near misses a policy finds first."""
    text = format_answer(answer)
    head = len(format_answer("")) // 2  # the opening tag's length
    tags = [i for i in range(len(text)) if i < head or i >= head + len(answer)]
    at = rng.choice(tags)
    edit = rng.choice(("delete", "replace", "insert"))
    if edit == "delete":
        return text[:at] + text[at + 1:]
    char = rng.choice([c for c in TAG_EDITS if c != text[at]] if edit == "replace" else TAG_EDITS)
    return text[:at] + char + text[at + (edit == "replace"):]


def mangled_answers(answer: str, wrong: str, rng: random.Random) -> list[str]:
    """Wrong answers in the trained format that keep some of the right one (``wrong``: another answer)."""
    cut = answer[: max(1, len(answer) // 2)]
    junk = "".join(rng.choice(JUNK) for _ in range(rng.randint(1, 4)))
    texts = [answer * 2, answer + wrong, wrong + answer, junk, junk + answer, answer + junk]
    return [format_answer(t) for t in texts + ([cut] if cut != answer else [])]


def synthetic_pairs(rows: Sequence[dict[str, Any]], per_prompt: int, seed: int) -> list[PreferencePair]:
    """``per_prompt`` pairs for each row (with ``id``, ``answer``, ``data_source``), reproducible from ``seed``."""
    rng = random.Random(seed)
    answers: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        if str(row["answer"]) not in answers[row["data_source"]]:
            answers[row["data_source"]].append(str(row["answer"]))
    pairs = []
    kinds, weights = list(KIND_SHARES), list(KIND_SHARES.values())
    for row in rows:
        answer = str(row["answer"])
        wrong = [a for a in answers[row["data_source"]] if a != answer]
        for _ in range(per_prompt):
            kind = rng.choices(kinds, weights)[0] if wrong else "bad_format"
            if kind == "wrong_answer":
                rejected = format_answer(rng.choice(wrong))
            elif kind == "mangled":
                rejected = rng.choice(mangled_answers(answer, rng.choice(wrong), rng))
            elif rng.random() < 0.5:
                rejected = corrupt_tag(answer, rng)
            else:
                rejected = rng.choice(broken_formats(answer))
            pairs.append(PreferencePair(str(row["id"]), format_answer(answer), rejected, kind))
    return pairs


def write_pairs(path: Path, pairs: Sequence[PreferencePair]) -> Path:
    """Write ``pairs`` as JSON lines (atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(asdict(p)) + "\n" for p in pairs))
    tmp.replace(path)
    return path
