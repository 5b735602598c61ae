"""Counts of a step's tool use: calls by tool, tool failures and repairs by tool and kind, the model's call errors
by kind."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mmrl.agent.calls import CALL_ERROR_KINDS, CallError
from mmrl.agent.outputs import TOOL_FAILURE_KINDS, TOOL_REPAIR_KINDS, ToolOutput


@dataclass
class ToolStats:
    calls: Counter[str] = field(default_factory=Counter)  # tool name -> calls run (failed ones included)
    failures: Counter[tuple[str, str]] = field(default_factory=Counter)  # (tool name, failure kind) -> calls
    call_errors: Counter[str] = field(default_factory=Counter)  # kind -> malformed calls (never run)
    repairs: Counter[tuple[str, str]] = field(default_factory=Counter)  # (tool name, repair kind) -> calls

    def record(self, tool: str, output: ToolOutput) -> None:
        """A call of ``tool`` that ran, and its output."""
        self.calls[tool] += 1
        if output.failure is not None:
            self.failures[tool, output.failure] += 1
        for kind in output.repairs:
            self.repairs[tool, kind] += 1

    def record_error(self, error: CallError) -> None:
        self.call_errors[error.kind] += 1

    def update(self, other: ToolStats) -> None:
        self.calls.update(other.calls)
        self.failures.update(other.failures)
        self.call_errors.update(other.call_errors)
        self.repairs.update(other.repairs)

    def metrics(self, tools: list[str]) -> dict[str, float]:
        """``agent/tool_calls[/<tool>]`` for every tool of ``tools``, ``agent/tool_errors[/<kind>]`` for every
        kind (zeros included, so that a series starts at the first step), ``agent/tool_errors/<tool>/<kind>``
        for the failures that happened; likewise ``agent/tool_repairs[/<kind>]`` and
        ``agent/tool_repairs/<tool>/<kind>`` for the outputs made safe (:data:`TOOL_REPAIR_KINDS`; not errors)."""
        out = {"agent/tool_calls": float(sum(self.calls.values()))}
        out |= {f"agent/tool_calls/{tool}": float(self.calls[tool]) for tool in tools}
        by_kind = Counter(self.call_errors)
        for (_, kind), count in self.failures.items():
            by_kind[kind] += count
        out["agent/tool_errors"] = float(sum(by_kind.values()))
        out |= {f"agent/tool_errors/{kind}": float(by_kind[kind]) for kind in TOOL_FAILURE_KINDS + CALL_ERROR_KINDS}
        out |= {f"agent/tool_errors/{tool}/{kind}": float(count) for (tool, kind), count in self.failures.items()}
        out["agent/tool_repairs"] = float(sum(self.repairs.values()))
        out |= {f"agent/tool_repairs/{kind}": float(sum(n for (_, k), n in self.repairs.items() if k == kind))
                for kind in TOOL_REPAIR_KINDS}
        out |= {f"agent/tool_repairs/{tool}/{kind}": float(count) for (tool, kind), count in self.repairs.items()}
        return out
