"""The tools of a run, by the name the model calls them: their specs, schemas and argument validators, and the
tool-call format the policy's calls are read in.

Built once per run by :func:`build_tool_table` from the config's specs and the model family's format
(:attr:`mmrl.agent.chat.ChatFormat.calls`); each schema is read where the tool's code runs (a worker process
unless the executor is inline), so the driver never imports a user's tool.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from mmrl.agent.calls import CallError, ToolCall, parse_calls
from mmrl.agent.executor import ToolExecutor
from mmrl.agent.registry import check_spec
from mmrl.agent.schemas import function_definition
from mmrl.models.tool_calls import QWEN_TOOL_CALLS, ToolCallFormat
from mmrl.plugins.spec import absolute_spec


@dataclass(frozen=True)
class ToolEntry:
    name: str
    spec: str  # as the workers resolve it (a file's path absolute)
    schema: dict[str, Any]
    validator: Draft202012Validator


class ToolTable:
    """Tools by name, in the order the config gave them (the order the system prompt lists them). ``fmt`` is the
    tool-call format :meth:`parse` reads, the model family's (:attr:`mmrl.agent.chat.ChatFormat.calls`); Qwen's,
    every family's today, unless given, which a table built only for its :meth:`definitions` may keep."""

    def __init__(self, entries: Sequence[ToolEntry], fmt: ToolCallFormat = QWEN_TOOL_CALLS) -> None:
        self.fmt = fmt
        self._entries: dict[str, ToolEntry] = {}
        for entry in entries:
            if entry.name in self._entries:
                raise ValueError(f"two tools are named {entry.name!r} ({self._entries[entry.name].spec} and "
                                 f"{entry.spec}); give one of them another name in its @tool(..., name=...)")
            self._entries[entry.name] = entry

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[ToolEntry]:
        return iter(self._entries.values())

    def __getitem__(self, name: str) -> ToolEntry:
        return self._entries[name]

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def definitions(self) -> list[dict[str, Any]]:
        """The schemas as ``apply_chat_template(tools=...)`` takes them."""
        return [function_definition(entry.schema) for entry in self]

    def parse(self, text: str) -> list[ToolCall | CallError]:
        """The calls in a turn's text, read in the table's format and checked against these tools
        (:func:`mmrl.agent.calls.parse_calls`)."""
        return parse_calls(text, {name: entry.validator for name, entry in self._entries.items()}, self.fmt)


def build_tool_table(specs: Sequence[str], executor: ToolExecutor, fmt: ToolCallFormat = QWEN_TOOL_CALLS
                     ) -> ToolTable:
    """The tools ``specs`` name (:mod:`mmrl.agent.registry`), their schemas read through ``executor``; their calls
    read in ``fmt``, the family's (``ChatFormat(processor).calls``) wherever the table parses the policy's turns.
    Raises TypeError/ValueError naming a bad spec or schema, before any episode runs."""
    if isinstance(specs, str) or not all(isinstance(s, str) for s in specs):
        raise TypeError(f"tools must be a list of tool specs (strings), got {specs!r}")
    for spec in specs:
        check_spec(spec)
    resolved = [absolute_spec(spec) for spec in specs]
    schemas = executor.describe(resolved) if resolved else []
    return ToolTable([ToolEntry(s["name"], spec, s, Draft202012Validator(s["parameters"]))
                      for spec, s in zip(resolved, schemas)], fmt)
