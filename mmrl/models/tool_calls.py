"""Tool-call formats: how a model family's policy writes a call, and how the tools and their outputs are put to it.

Each family declares its format (:attr:`mmrl.models.families.base.Family.tool_calls`); the agent's chat format
(:class:`mmrl.agent.chat.ChatFormat`) takes the one of the processor's family. A format owns the text only:

- **calls**: :meth:`ToolCallFormat.format_call` writes one as the policy would; :meth:`ToolCallFormat.read_calls`
  reads every call of a turn's text, in order, each a :class:`ToolCall` (its name and arguments as written) or
  a :class:`CallError` of the text itself (``bad_json``, ``bad_format``). Checking a call against the tools'
  schemas (``unknown_tool``, ``bad_arguments``) is the agent's (:func:`mmrl.agent.calls.parse_calls`);
- **the tools**: :meth:`ToolCallFormat.tools_block`, the system message's tools section, for a chat template that
  does not write one itself;
- **outputs**: :meth:`ToolCallFormat.tool_responses`, a run of tool outputs as one user turn's text, for a chat
  template without a ``tool`` role.

:data:`QWEN_TOOL_CALLS` is Qwen's (the Hermes format), the only one today::

    <tool_call>
    {"name": "zoom_in", "arguments": {"bbox_2d": [10, 20, 60, 80]}}
    </tool_call>
"""

from __future__ import annotations

import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CALL_ERROR_KINDS: tuple[str, ...] = ("bad_json", "bad_format", "unknown_tool", "bad_arguments")


@dataclass(frozen=True)
class ToolCall:
    """A call: the tool's name and its arguments (once checked by the agent, a known tool's valid arguments)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class CallError:
    """A call the model got wrong: ``kind`` one of :data:`CALL_ERROR_KINDS`; ``name`` the tool it named, if any.
    ``message`` is short and says what to fix: the tool turn hands it to the model."""

    kind: str
    message: str
    name: str = ""


class ToolCallFormat(ABC):
    """One way of writing tool calls, tool lists and tool outputs (see the module's docstring)."""

    name: str = ""
    """How the format is called (in messages and tests)."""

    @abstractmethod
    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """A call as the policy writes it (demonstrations are written with this)."""

    @abstractmethod
    def has_calls(self, text: str) -> bool:
        """Whether ``text`` holds a tool call, well-formed or not (an episode then goes on with a tool turn)."""

    @abstractmethod
    def read_calls(self, text: str) -> list[ToolCall | CallError]:
        """Every call of ``text`` in order, as written (not checked against any tool), or what is wrong with its
        text (``bad_json``, ``bad_format``)."""

    @abstractmethod
    def tools_block(self, tools: Sequence[dict[str, Any]]) -> str:
        """The tools section of a system message, listing ``tools`` (``{"type": "function", ...}`` dicts)."""

    @abstractmethod
    def tool_responses(self, contents: Sequence[str]) -> str:
        """The text of one user turn that carries a run of tool outputs (each output's content, in order)."""

    def __repr__(self) -> str:
        return f"<tool-call format {self.name}>"


class QwenToolCalls(ToolCallFormat):
    """Qwen's format (Hermes'): a JSON object ``{"name", "arguments"}`` per ``<tool_call>`` block, the tools as
    JSON lines in ``<tools>``, each output in a ``<tool_response>`` block. The text the native Qwen templates
    (Qwen2.5's text models', Qwen3-VL's) write."""

    name = "qwen"
    open, close = "<tool_call>", "</tool_call>"
    response_open, response_close = "<tool_response>\n", "\n</tool_response>"
    shape = '{"name": <tool name>, "arguments": {<argument>: <value>, ...}}'  # named in error messages

    def __init__(self) -> None:
        self._block = re.compile(re.escape(self.open) + r"(.*?)" + re.escape(self.close), re.DOTALL)

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"{self.open}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{self.close}"

    def has_calls(self, text: str) -> bool:
        return self.open in text

    def read_calls(self, text: str) -> list[ToolCall | CallError]:
        """Each ``<tool_call>`` block's body as JSON (NaN and infinities refused); a block never closed is a
        ``bad_format`` error after the others."""
        found: list[ToolCall | CallError] = []
        end = 0
        for match in self._block.finditer(text):
            found.append(self.read_body(match.group(1)))
            end = match.end()
        if self.open in text[end:]:
            found.append(CallError("bad_format", f"a {self.open} was not closed; end each call with {self.close}"))
        return found

    def read_body(self, body: str) -> ToolCall | CallError:
        """The body of one block -> the call as written, or what is wrong with its text."""
        try:
            call = json.loads(body, parse_constant=_refuse_constant, parse_float=_finite_float)
        except (ValueError, RecursionError) as err:
            reason = err.msg if isinstance(err, json.JSONDecodeError) else str(err)
            return CallError("bad_json", f"the tool call is not valid JSON ({reason}); write {self.shape}")
        named = isinstance(call, dict) and isinstance(call.get("name"), str)
        if not (named and isinstance(call.get("arguments"), dict)):
            return CallError("bad_format", f"a tool call must be {self.shape}")
        return ToolCall(call["name"], call["arguments"])

    def tools_block(self, tools: Sequence[dict[str, Any]]) -> str:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n"
                f"<tools>\n{listed}\n</tools>\n\n"
                "For each function call, return a json object with function name and arguments within "
                f"{self.open}{self.close} XML tags:\n{self.open}\n"
                f'{{"name": <function-name>, "arguments": <args-json-object>}}\n{self.close}')

    def tool_responses(self, contents: Sequence[str]) -> str:
        """One ``<tool_response>`` block per output, a newline between blocks: how the native Qwen templates
        render role ``tool``."""
        return "\n".join(self.response_open + content + self.response_close for content in contents)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


QWEN_TOOL_CALLS = QwenToolCalls()
