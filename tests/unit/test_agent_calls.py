"""Tool calls parsed from the policy's text (in Qwen's format, every family's today): well-formed ones, and each
way the model can get one wrong."""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator

from mmrl.agent.builtin import BUILTINS
from mmrl.agent.calls import CallError, ToolCall, parse_calls
from mmrl.agent.schemas import schema_of
from mmrl.models.tool_calls import QWEN_TOOL_CALLS as QWEN

VALIDATORS = {name: Draft202012Validator(schema_of(fn)["parameters"]) for name, fn in BUILTINS.items()}


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_well_formed_calls_in_order() -> None:
    text = ("Let me look closer. " + block('{"name": "zoom_in", "arguments": {"bbox_2d": [10, 20.5, 60, 80]}}')
            + "\n" + block('{"name": "calculator", "arguments": {"expression": "2 + 3"}}') + "<|im_end|>")
    assert QWEN.has_calls(text)
    assert parse_calls(text, VALIDATORS, QWEN) == [
        ToolCall("zoom_in", {"bbox_2d": [10, 20.5, 60, 80]}),
        ToolCall("calculator", {"expression": "2 + 3"}),
    ]
    assert not QWEN.has_calls("<answer>red</answer>")
    assert parse_calls("<answer>red</answer>", VALIDATORS, QWEN) == []


# The model's text -> the kind of error and a fragment of the message it reads back.
MALFORMED = {
    "not json": (block('{"name": "zoom_in", "arguments": {"bbox_2d": [1, 2, 3, 4]}'), "bad_json", "not valid JSON"),
    "nan": (block('{"name": "zoom_in", "arguments": {"bbox_2d": [NaN, 2, 3, 4]}}'), "bad_json", "NaN"),
    "overflow": (block('{"name": "zoom_in", "arguments": {"bbox_2d": [1e999, 2, 3, 4]}}'), "bad_json", "out of range"),
    "deep": (block("[" * 100_000 + "]" * 100_000), "bad_json", "not valid JSON"),
    "a list": (block('[{"name": "zoom_in"}]'), "bad_format", '{"name": <tool name>'),
    "no arguments": (block('{"name": "zoom_in"}'), "bad_format", "arguments"),
    "arguments a string": (block('{"name": "crop", "arguments": "[1, 2, 3, 4]"}'), "bad_format", "arguments"),
    "unclosed": ("<tool_call>\n{\"name\": \"crop\"", "bad_format", "was not closed"),
    "unknown": (block('{"name": "rotate", "arguments": {}}'), "unknown_tool",
                "the tools are calculator, crop, zoom_in"),
    "missing": (block('{"name": "crop", "arguments": {"image": 0}}'), "bad_arguments", "'bbox_2d' is a required"),
    "short box": (block('{"name": "crop", "arguments": {"bbox_2d": [1, 2, 3]}}'), "bad_arguments", "is too short"),
    "wrong type": (block('{"name": "crop", "arguments": {"bbox_2d": [1, 2, "x", 4]}}'), "bad_arguments",
                   "'x' is not of type 'number' (at bbox_2d[2])"),
    "extra": (block('{"name": "calculator", "arguments": {"expression": "1", "unit": "m"}}'), "bad_arguments",
              "'unit' was unexpected"),
    "context keyword": (block('{"name": "calculator", "arguments": {"expression": "1", "images": []}}'),
                        "bad_arguments", "['images'] are not arguments"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_call_is_an_error_with_a_short_message(case: str) -> None:
    text, kind, fragment = MALFORMED[case]
    [error] = parse_calls(text, VALIDATORS, QWEN)
    assert isinstance(error, CallError) and error.kind == kind
    assert fragment in error.message and len(error.message) < 300


def test_a_bad_call_does_not_hide_the_good_ones_around_it() -> None:
    text = (block('{"name": "crop", "arguments": {"bbox_2d": [0, 0, 5, 5]}}') + block("{oops")
            + block('{"name": "calculator", "arguments": {"expression": "1+1"}}') + "<tool_call>{")
    found = parse_calls(text, VALIDATORS, QWEN)
    assert [type(f).__name__ for f in found] == ["ToolCall", "CallError", "ToolCall", "CallError"]
    assert [f.kind for f in found if isinstance(f, CallError)] == ["bad_json", "bad_format"]
