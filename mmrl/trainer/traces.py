"""A sample of each RL step's episodes as MLflow traces of the run (``tracking.trace_episodes``).

One trace per sample, named ``episode``, under the active run and its experiment (the UI's Traces tab of the
experiment, or of the run). Its root span holds the prompt and the images the model saw (inputs, as attachments),
the final answer (output) and, as attributes and trace tags, the step, the sample's index, data source and prompt
id, its reward, verdict and weight version. Below it, in order, a span per policy turn (``turn_<n>``: its text) and
per tool call (the tool's name: its arguments in, its text and returned images out, its failure kind and repairs).
A single-turn sample is a trace of its root span alone. The samples are picked evenly over the batch
(:func:`picked`), in the driver, which holds the step's batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlflow
from mlflow.tracing.attachments import Attachment

from mmrl.protocol import Batch
from rewards import prompt_text


@dataclass
class SpanPlan:
    """One span to log: its name, type, inputs, outputs and attributes."""

    name: str
    span_type: str
    inputs: Any = None
    outputs: Any = None
    attributes: dict[str, Any] = field(default_factory=dict)


def picked(count: int, k: int) -> list[int]:
    """``k`` of ``count`` sample indices, evenly spaced from the first (all of them when ``k >= count``)."""
    k = min(k, count)
    return [i * count // k for i in range(k)]


def png(data: bytes) -> Attachment:
    """An image's PNG bytes (as data prep and the tools store them) as a trace attachment."""
    return Attachment(content_type="image/png", content_bytes=data)


def turn_spans(record: dict[str, Any]) -> list[SpanPlan]:
    """An episode record (:func:`mmrl.agent.rollout.episode_record`) -> its policy turns' and tool calls' spans."""
    spans, turn = [], 0
    for entry in record.get("turns", []):
        if entry["role"] == "assistant":
            spans.append(SpanPlan(f"turn_{turn}", "LLM", inputs={"turn": turn}, outputs=entry["text"],
                                  attributes={"mmrl.turn": turn, "mmrl.chars": len(entry["text"])}))
            turn += 1
        else:
            spans += [call_span(record["calls"][index]) for index in entry["calls"]]
    return spans


def call_span(call: dict[str, Any]) -> SpanPlan:
    """One tool call's span; a malformed call is named ``malformed_call`` and its inputs give the error kind."""
    name = call.get("name") or "malformed_call"
    inputs = call["arguments"] if "arguments" in call else {"error": call.get("error")}
    return SpanPlan(name, "TOOL", inputs=inputs, outputs={"text": call["text"],
                                                         "images": [png(b) for b in call["images"]]},
                    attributes={"mmrl.tool": name, "mmrl.turn": call["turn"], "mmrl.failure": call["failure"] or "",
                                "mmrl.repairs": list(call.get("repairs", ())), "mmrl.images": len(call["images"])})


def sample_fields(batch: Batch, i: int) -> dict[str, Any]:
    """Sample ``i``'s facts the root span and the trace's tags carry (those the batch has)."""
    facts: dict[str, Any] = {"mmrl.sample": i}
    for key in ("data_source", "uid"):
        if key in batch.objects:
            facts[f"mmrl.{key}"] = str(batch[key][i])
    if "token_level_rewards" in batch.tensors:
        facts["mmrl.reward"] = float(batch["token_level_rewards"][i].sum())
    for key in ("correct", "weight_version", "num_turns", "num_tool_calls"):
        if key in batch.tensors:
            facts[f"mmrl.{key}"] = batch[key][i].item()
    if "episode" in batch.objects:
        facts["mmrl.cut"] = batch["episode"][i].get("cut") or ""
    return facts


def episode_plan(batch: Batch, i: int, step: int) -> tuple[SpanPlan, list[SpanPlan]]:
    """Sample ``i`` of the step's batch -> (its root span, its children in order)."""
    messages = batch["messages"][i] if "messages" in batch.objects else []
    images = batch["images"][i] if "images" in batch.objects else []
    root = SpanPlan("episode", "AGENT", inputs={"prompt": prompt_text(messages), "images": [png(b) for b in images]},
                    outputs=batch["response_text"][i], attributes={"mmrl.step": step, **sample_fields(batch, i)})
    record = batch["episode"][i] if "episode" in batch.objects else {}
    return root, turn_spans(record or {})


def log_traces(batch: Batch, step: int, k: int) -> int:
    """``k`` samples of step ``step``'s scored batch as traces of the active run; returns how many were logged."""
    chosen = picked(len(batch), k)
    for i in chosen:
        root_plan, children = episode_plan(batch, i, step)
        tags = {key: str(value) for key, value in root_plan.attributes.items()}
        root = mlflow.start_span_no_context(root_plan.name, span_type=root_plan.span_type, inputs=root_plan.inputs,
                                            attributes=root_plan.attributes, tags=tags)
        for plan in children:
            span = mlflow.start_span_no_context(plan.name, span_type=plan.span_type, parent_span=root,
                                                inputs=plan.inputs, attributes=plan.attributes)
            span.set_outputs(plan.outputs)
            span.end()
        root.set_outputs(root_plan.outputs)
        root.end()
    return len(chosen)
