"""A generative judge's two ends: the question put to it, and its verdict read back as a score."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from mmrl.answer_format import extract_answer
from mmrl.plugins.safe_text import made_safe
from mmrl.schema import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from rewards.types import prompt_text

TEMPLATE_FIELDS = ("question", "response", "ground_truth")
_MEDIA = re.compile(f"{re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)}")
_WORD = re.compile(r"[a-z]+")
YES = frozenset({"yes", "correct", "true", "right"})
NO = frozenset({"no", "incorrect", "wrong", "false"})


def check_template(template: str) -> None:
    """Raise ValueError unless ``template`` formats with exactly the fields of :data:`TEMPLATE_FIELDS`."""
    try:
        template.format(**dict.fromkeys(TEMPLATE_FIELDS, ""))
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"reward.judge.template cannot be filled ({type(err).__name__}: {err}); it may use "
                         f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)}, and literal braces are written {{{{ }}}}")
    if "{response}" not in template:
        raise ValueError("reward.judge.template must contain {response}: the judge has to see what it judges")


def judge_messages(messages: Sequence[dict[str, Any]], response: str, ground_truth: str,
                   template: str) -> list[dict[str, Any]]:
    """The judge's chat: one user turn holding the prompt's media placeholders (in order), then the template
    filled with the prompt's text (``question``), the policy's ``response`` and the ``ground_truth``."""
    text = prompt_text(list(messages))
    placeholders = "".join(match.group(0) for match in _MEDIA.finditer(text))
    question = " ".join(_MEDIA.sub(" ", text).split())
    body = template.format(question=question, response=response, ground_truth=ground_truth)
    return [{"role": "user", "content": placeholders + body}]


def plain_text(text: str, reserved: Iterable[str] = ()) -> str:
    """``text`` made safe to show the judge (:func:`mmrl.plugins.safe_text.made_safe`): valid Unicode without
    control characters or terminal escapes, its media placeholders and the ``reserved`` strings (the judge's
    special tokens: :func:`mmrl.agent.chat.reserved_for`) blanked. A response or a tool's text that writes
    ``<image>`` must not ask the judge for an image it is not given, nor one that writes ``<|im_end|>`` end the
    judge's question."""
    return made_safe(text, (IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, *reserved))


def episode_transcript(record: dict[str, Any], reserved: Iterable[str] = ()) -> tuple[str, list[bytes]]:
    """An agent episode (:func:`mmrl.agent.rollout.episode_record`) as the judge reads it: its turns in order,
    ``assistant: <text>`` for the policy's and ``tool <name>: <text>`` plus one image placeholder per returned image
    for each call a tool turn answers (a malformed call: its error message), the texts made safe
    (:func:`plain_text` with ``reserved``); and the tools' images (PNG bytes), in the order of their placeholders."""
    reserved = tuple(reserved)
    lines, images = [], []
    for turn in record["turns"]:
        if turn["role"] == "assistant":
            lines.append(f"assistant: {plain_text(turn['text'], reserved)}")
            continue
        for index in turn["calls"]:
            call = record["calls"][index]
            name = plain_text(call["name"] or call.get("error", "call"), reserved)
            lines.append(f"tool {name}: " + IMAGE_PLACEHOLDER * len(call["images"]) + plain_text(call["text"], reserved))
            images += call["images"]
    return "\n".join(lines), images


def parse_verdict(text: str) -> float | None:
    """1.0 for a yes, 0.0 for a no, None when the judge said neither.

    The verdict is the first word of the judge's answer (inside ``<answer>`` tags when it used them):
    yes / correct / true / right, or no / incorrect / wrong / false, in any case.
    """
    answer = extract_answer(text)  # special tokens are dropped there
    if answer is None:
        return None
    word = _WORD.search(answer.lower())
    if word is None:
        return None
    if word.group(0) in YES:
        return 1.0
    if word.group(0) in NO:
        return 0.0
    return None
