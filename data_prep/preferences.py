"""Preference pairs for reward-model training: (prompt, chosen response, rejected response).

A pairs file is JSON lines, one pair per line: ``{"prompt_id": <id of a row of the split>, "chosen": str,
"rejected": str}``; ``kind`` is optional. :func:`synthetic_pairs` makes them from labelled prompt rows (the
demo tasks): the chosen response is the right answer in the trained format; the rejected one is

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rewards.verifiers import format_answer

KIND_SHARES = {"wrong_answer": 0.45, "mangled": 0.25, "bad_format": 0.3}
TAG_EDITS = "</>"
JUNK = "\x10#*~_<>/"


@dataclass(frozen=True)
class PreferencePair:
    prompt_id: str
    chosen: str
    rejected: str
    kind: str = ""
    """How the pair was made (``wrong_answer``, ``bad_format``), for per-kind accuracy; empty when unknown."""


def broken_formats(answer: str) -> list[str]:
    """The right answer written in ways the trained format does not allow."""
    tag = format_answer(answer)
    return [answer, tag[: -len("</answer>")], f"{tag}{tag}", tag.replace("answer", "ans"), format_answer("")]


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


def read_pairs(path: Path, known_ids: set[str]) -> list[PreferencePair]:
    """The pairs of a JSON-lines file; a bad line raises ValueError naming it and what to fix."""
    pairs = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where} is not JSON ({err}); write one object per line") from err
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected an object with prompt_id, chosen, rejected")
        missing = [k for k in ("prompt_id", "chosen", "rejected") if not isinstance(item.get(k), str)]
        if missing:
            raise ValueError(f"{where}: {', '.join(missing)} missing or not a string; each pair needs "
                             "prompt_id, chosen and rejected as strings")
        if item["prompt_id"] not in known_ids:
            raise ValueError(f"{where}: prompt_id {item['prompt_id']!r} is not a row id of the split; "
                             "pairs refer to prompts by the id column of the data-prep parquet")
        if item["chosen"] == item["rejected"]:
            raise ValueError(f"{where}: chosen and rejected are the same text; a pair must differ")
        pairs.append(PreferencePair(item["prompt_id"], item["chosen"], item["rejected"], str(item.get("kind", ""))))
    if not pairs:
        raise ValueError(f"{path} holds no pairs")
    return pairs
