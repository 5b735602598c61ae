"""The family table: every family declares its model groups and its tool-call format in its own class; the
groups resolve on the family's tiny model and cover every parameter; each family's format round-trips (a call
formatted, then parsed back, is the same call); the chat format writes the family's format, and the tool table
and the agent loop read the policy's calls in it (shown with formats other than Qwen's, written here)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from jsonschema import Draft202012Validator

from mmrl.agent.calls import CallError, ToolCall, parse_calls
from mmrl.agent.chat import ChatFormat
from mmrl.agent.episode import EpisodeLimits
from mmrl.agent.executor import ToolExecutor
from mmrl.agent.loop import AgentLoop
from mmrl.agent.scripted import ScriptedTurns
from mmrl.agent.table import ToolTable, build_tool_table
from mmrl.models.encoding import encode_prompt
from mmrl.models.families import FAMILIES, Family, check_family, family_named
from mmrl.models.families.groups import ModelGroups
from mmrl.models.forward import core_model
from mmrl.models.loading import load_model, load_processor
from mmrl.models.tool_calls import QWEN_TOOL_CALLS, QwenToolCalls, ToolCallFormat
from mmrl.rollout.base import SamplingParams

NAMES = list(FAMILIES)
CALLS = [
    ("zoom_in", {"bbox_2d": [10, 20, 60, 80]}),
    ("calculator", {"expression": "6*7", "note": "ünïcode \"quoted\" </tool_call-ish>"}),
    ("lookup", {"nested": {"a": [1.5, -2, None, True]}, "empty": {}}),
    ("no_arguments", {}),
]
SCHEMA = {"type": "object"}  # any object: the round trip is the format's, not the tools' checks
TOOLS = [{"type": "function", "function": {"name": "zoom_in", "description": "Zoom in on a region.",
                                           "parameters": {"type": "object", "properties": {}}}}]


def test_every_family_declares_its_groups_and_tool_call_format_in_its_own_class():
    assert "groups" not in vars(Family) and "tool_calls" not in vars(Family)  # no default to fall back on
    for name, family in FAMILIES.items():
        assert family.name == name and family_named(name) is family
        assert isinstance(family.groups, ModelGroups), name
        assert isinstance(family.tool_calls, ToolCallFormat), name
        declared = {attr for cls in type(family).__mro__ if cls is not Family and issubclass(cls, Family)
                    for attr in vars(cls)}
        assert {"groups", "tool_calls"} <= declared, name


def test_a_family_without_its_declarations_is_refused():
    class Bare(Family):
        name = "bare"

    with pytest.raises(TypeError, match="bare declares no groups"):
        check_family(Bare())

    class HalfDone(Family):
        name = "half"
        groups = FAMILIES["qwen2_vl"].groups

    with pytest.raises(TypeError, match="half declares no tool_calls"):
        check_family(HalfDone())


@pytest.mark.parametrize("name", NAMES)
def test_the_familys_tool_call_format_round_trips(name):
    fmt = family_named(name).tool_calls
    validators = {tool: Draft202012Validator(SCHEMA) for tool, _ in CALLS}
    for tool, arguments in CALLS:
        text = fmt.format_call(tool, arguments)
        assert fmt.has_calls(text)
        assert fmt.read_calls(text) == [ToolCall(tool, arguments)]
        assert parse_calls(f"Let me look.\n{text}", validators, fmt) == [ToolCall(tool, arguments)]
    turn = "\n".join(fmt.format_call(tool, arguments) for tool, arguments in CALLS)
    assert parse_calls(turn, validators, fmt) == [ToolCall(tool, arguments) for tool, arguments in CALLS]
    assert not fmt.has_calls("<answer>red</answer>") and fmt.read_calls("<answer>red</answer>") == []
    # A call cut off before its end is the format's error, after the calls before it.
    cut = fmt.format_call(*CALLS[0])
    found = parse_calls(cut + cut[: len(cut) // 2], validators, fmt)
    assert found[0] == ToolCall(*CALLS[0]) and isinstance(found[1], CallError) and found[1].kind == "bad_format"


@pytest.mark.parametrize("name", NAMES)
def test_the_familys_tools_block_and_tool_responses_carry_what_they_are_given(name):
    fmt = family_named(name).tool_calls
    block = fmt.tools_block(TOOLS)
    assert '"name": "zoom_in"' in block and "Zoom in on a region." in block
    responses = fmt.tool_responses(["first output", "second output"])
    assert responses.index("first output") < responses.index("second output")


@pytest.fixture(scope="module", params=NAMES)
def loaded(request, family_dirs):
    name = request.param
    return name, load_model(family_dirs[name]), load_processor(family_dirs[name])


def test_the_groups_resolve_and_cover_every_parameter(loaded):
    name, model, _ = loaded
    family = family_named(name)
    groups = family.groups
    core = core_model(model)
    assert family.vision(core) is groups.vision_module(core)
    assert isinstance(groups.vision_block_modules(core), torch.nn.ModuleList)
    assert isinstance(groups.decoder_layer_modules(core), torch.nn.ModuleList)
    assert len(family.vision_blocks(core)) >= 1 and len(family.decoder_layers(core)) == 2
    assert isinstance(groups.projector_module(core), torch.nn.Module) and groups.llm_module(core) is not None
    names = dict(model.named_parameters())
    by_group: dict[str | None, set[str]] = {}
    for param in names:
        by_group.setdefault(groups.group_of(param), set()).add(param)
    assert None not in by_group, f"{name}: parameters of no group: {sorted(by_group[None])[:3]}"
    prefixes = groups.prefixes()
    modules = {"vision_blocks": family.vision_blocks(core), "decoder_layers": family.decoder_layers(core),
               "projector": groups.projector_module(core), "head": model.get_output_embeddings()}
    for group, module in modules.items():
        assert {id(p) for p in module.parameters()} == {id(names[n]) for n in by_group[group]}, (name, group)
        assert all(n.startswith(prefixes[group]) for n in by_group[group])
    # The projector is inside the tower for the Qwen families, beside it (with the language model) for SmolVLM.
    inside = prefixes["projector"].startswith(prefixes["vision"])
    assert inside == (name != "smolvlm")
    tower = {id(p) for p in family.vision(core).parameters()}
    assert ({id(p) for p in groups.projector_module(core).parameters()} <= tower) == inside


def test_the_chat_format_takes_the_familys_tool_call_format(loaded):
    name, _, processor = loaded
    family = family_named(name)
    chat = ChatFormat(processor)
    assert chat.calls is family.tool_calls
    assert not chat.native_tools  # the tiny models' templates ignore tools=: mmrl writes the block
    messages = chat.with_tools([{"role": "user", "content": "<image>What colour?"}], TOOLS)
    assert messages[0] == {"role": "system", "content": family.tool_calls.tools_block(TOOLS)}


class Bracketed(ToolCallFormat):
    """A format unlike Qwen's, to show that the chat format writes whatever the family declares."""

    name = "bracketed"

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"[[{name}|{sorted(arguments.items())}]]"

    def has_calls(self, text: str) -> bool:
        return "[[" in text

    def read_calls(self, text: str) -> list[ToolCall | CallError]:
        return []

    def tools_block(self, tools: Any) -> str:
        return "TOOLS: " + ", ".join(t["function"]["name"] for t in tools)

    def tool_responses(self, contents: Any) -> str:
        return " | ".join(f"<<{c}>>" for c in contents)


def test_another_declared_format_is_the_one_the_chat_format_writes(family_dirs, monkeypatch):
    family = family_named("smolvlm")
    monkeypatch.setattr(family, "tool_calls", Bracketed())
    chat = ChatFormat(load_processor(family_dirs["smolvlm"]))
    assert chat.with_tools([{"role": "user", "content": "Hi"}], TOOLS)[0]["content"] == "TOOLS: zoom_in"
    merged = chat.in_format([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                             {"role": "tool", "content": "one"}, {"role": "tool", "content": "two"}])
    assert merged[2:] == [{"role": "user", "content": "<<one>> | <<two>>"}]


class Angled(QwenToolCalls):
    """Qwen's JSON calls between other delimiters: a format in which Qwen's text holds no call."""

    name = "angled"
    open, close = "<<call>>", "<</call>>"


ANGLED = Angled()


def test_a_tool_table_reads_calls_in_its_format_only():
    six_times_seven = ("calculator", {"expression": "6*7"})
    with ToolExecutor(isolation="inline") as executor:
        angled = build_tool_table(["calculator", "crop"], executor, fmt=ANGLED)
        qwen = build_tool_table(["calculator", "crop"], executor)
    assert angled.fmt is ANGLED and qwen.fmt is QWEN_TOOL_CALLS  # Qwen's where none is given
    text = "Let me work it out. " + "\n".join(ANGLED.format_call(*call) for call in [
        six_times_seven, ("crop", {"bbox_2d": [1, 2, 3]}), ("rotate", {})])
    assert text.startswith("Let me work it out. <<call>>\n{")
    # Read in its format, each call checked against the tools as in Qwen's.
    found = angled.parse(text)
    assert found[0] == ToolCall(*six_times_seven)
    assert [(f.kind, f.name) for f in found[1:] if isinstance(f, CallError)] == [("bad_arguments", "crop"),
                                                                                ("unknown_tool", "rotate")]
    assert angled.parse(ANGLED.format_call(*six_times_seven)[:-3])[0].kind == "bad_format"  # never closed
    # Qwen's text holds no call in this format (the turn is an answer), and the Qwen table reads none of its calls.
    qwen_text = QWEN_TOOL_CALLS.format_call(*six_times_seven)
    assert angled.parse(qwen_text) == [] and qwen.parse(qwen_text) == [ToolCall(*six_times_seven)]
    assert qwen.parse(text) == []


def test_the_agent_loop_reads_the_policys_calls_in_the_familys_format(family_dirs, monkeypatch):
    family = family_named("smolvlm")
    monkeypatch.setattr(family, "tool_calls", ANGLED)
    processor = load_processor(family_dirs["smolvlm"])
    chat = ChatFormat(processor)
    limits = EpisodeLimits(max_turns=3, max_tool_calls=2, max_tokens=2000, max_new_tokens=200)
    call = ("calculator", {"expression": "6*7"})
    # Scripted policy turns: a call in the family's format then the answer; a call in Qwen's format.
    scripts = {"angled": [ANGLED.format_call(*call), "<answer>42</answer>"],
               "qwen": [QWEN_TOOL_CALLS.format_call(*call)]}
    with ToolExecutor(isolation="inline") as executor:
        table = build_tool_table(["calculator"], executor, fmt=chat.calls)
        prompts = [encode_prompt(processor, chat.with_tools([{"role": "user", "content": "6*7?"}], table.definitions()),
                                 [], name=name) for name in scripts]
        loop = AgentLoop(ScriptedTurns(scripts, processor.tokenizer), chat, table, executor, limits=limits,
                         max_model_len=4096)
        angled, qwen = loop.run(prompts, SamplingParams(n=1, max_new_tokens=limits.max_new_tokens))[0]
        # A table that reads another format than the family writes is refused by name.
        with pytest.raises(ValueError, match="smolvlm writes tool calls in the angled format, but the tool table "
                                             "reads the qwen format"):
            AgentLoop(ScriptedTurns(scripts, processor.tokenizer), chat, ToolTable(list(table)), executor,
                      max_model_len=4096)
    assert [(r.call, r.output.text) for r in angled.calls] == [(ToolCall(*call), "42")]
    assert angled.cut is None and angled.num_policy_turns == 2 and angled.final_text == "<answer>42</answer>"
    assert qwen.calls == [] and qwen.cut is None and qwen.num_policy_turns == 1  # no call here: its answer
