"""Tool calls in the policy's text, read in a tool-call format and checked against the tools' schemas.

The format, how a call is written, is the model family's (:attr:`mmrl.models.families.base.Family.tool_calls`,
:mod:`mmrl.models.tool_calls`; :attr:`mmrl.agent.chat.ChatFormat.calls` holds the processor's family's). Every
family declares Qwen's today::

    <tool_call>
    {"name": "zoom_in", "arguments": {"bbox_2d": [10, 20, 60, 80]}}
    </tool_call>

A turn may hold several calls. Each becomes a :class:`ToolCall`, or a :class:`CallError` when the model got it
wrong: ``bad_json`` (the body is not JSON: NaN and infinities included), ``bad_format`` (not an object with a
string ``name`` and an object ``arguments``, or a ``<tool_call>`` never closed), both read by the format;
``unknown_tool``, or ``bad_arguments`` (the arguments break the tool's JSON schema), checked here. A call
error's ``message`` is short and says what to fix: the tool turn hands it to the model.
"""

from __future__ import annotations

from collections.abc import Mapping

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from mmrl.agent.schemas import CONTEXT_KEYWORDS
from mmrl.models.tool_calls import CALL_ERROR_KINDS, CallError, ToolCall, ToolCallFormat

__all__ = ["CALL_ERROR_KINDS", "CallError", "ToolCall", "check_call", "parse_calls"]


def parse_calls(text: str, validators: Mapping[str, Draft202012Validator],
                fmt: ToolCallFormat) -> list[ToolCall | CallError]:
    """Every call of ``text`` in ``fmt``, in order, each checked against ``validators`` (tool name -> the
    validator of its arguments' schema)."""
    return [call if isinstance(call, CallError) else check_call(call, validators) for call in fmt.read_calls(text)]


def check_call(call: ToolCall, validators: Mapping[str, Draft202012Validator]) -> ToolCall | CallError:
    """A call as written -> the call, if it names a known tool with valid arguments, or what is wrong with it."""
    name, arguments = call.name, call.arguments
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
    return call
