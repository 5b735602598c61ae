"""Tool calls in the policy's text, in Qwen's format, parsed and checked against the tools' schemas::

    <tool_call>
    {"name": "zoom_in", "arguments": {"bbox_2d": [10, 20, 60, 80]}}
    </tool_call>

A turn may hold several calls. Each block becomes a :class:`ToolCall`, or a :class:`CallError` when the model
got it wrong: ``bad_json`` (the body is not JSON: NaN and infinities included), ``bad_format`` (not an object
with a string ``name`` and an object ``arguments``, or a ``<tool_call>`` never closed), ``unknown_tool``, or
``bad_arguments`` (the arguments break the tool's JSON schema). A call error's ``message`` is short and says
what to fix: the tool turn hands it to the model.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from mmrl.agent.schemas import CONTEXT_KEYWORDS

CALL_ERROR_KINDS: tuple[str, ...] = ("bad_json", "bad_format", "unknown_tool", "bad_arguments")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_FORMAT = '{"name": <tool name>, "arguments": {<argument>: <value>, ...}}'


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call of a known tool, its arguments valid under the tool's schema."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class CallError:
    """A call the model got wrong: ``kind`` one of :data:`CALL_ERROR_KINDS`; ``name`` the tool it named, if any."""

    kind: str
    message: str
    name: str = ""


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as the policy writes it (demonstrations are written with this)."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CLOSE}"


def has_calls(text: str) -> bool:
    """Whether ``text`` holds a tool call, well-formed or not (an episode then goes on with a tool turn)."""
    return OPEN in text


def parse_calls(text: str, validators: Mapping[str, Draft202012Validator]) -> list[ToolCall | CallError]:
    """Every ``<tool_call>`` block of ``text`` in order, each checked against ``validators`` (tool name -> the
    validator of its arguments' schema)."""
    found: list[ToolCall | CallError] = []
    end = 0
    for match in _BLOCK.finditer(text):
        found.append(parse_call(match.group(1), validators))
        end = match.end()
    if OPEN in text[end:]:
        found.append(CallError("bad_format", f"a {OPEN} was not closed; end each call with {CLOSE}"))
    return found


def parse_call(body: str, validators: Mapping[str, Draft202012Validator]) -> ToolCall | CallError:
    """The body of one block -> the call, or what is wrong with it."""
    try:
        call = json.loads(body, parse_constant=_refuse_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as err:
        reason = err.msg if isinstance(err, json.JSONDecodeError) else str(err)
        return CallError("bad_json", f"the tool call is not valid JSON ({reason}); write {_FORMAT}")
    if not (isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("arguments"), dict)):
        return CallError("bad_format", f"a tool call must be {_FORMAT}")
    name, arguments = call["name"], call["arguments"]
    validator = validators.get(name)
    if validator is None:
        return CallError("unknown_tool", f"unknown tool {name!r}; the tools are {', '.join(sorted(validators))}", name)
    reserved = sorted(set(arguments) & set(CONTEXT_KEYWORDS))
    if reserved:
        return CallError("bad_arguments", f"invalid arguments for {name}: {reserved} are not arguments of it", name)
    error = best_match(validator.iter_errors(arguments))
    if error is not None:
        where = "" if not error.absolute_path else f" (at {error.json_path.removeprefix('$.')})"
        return CallError("bad_arguments", f"invalid arguments for {name}: {error.message}{where}", name)
    return ToolCall(name, arguments)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value
