"""The tools in the system prompt and tool turns in the chat format, with the tiny model's processor.

Its template ignores ``tools`` (as the published Qwen2-VL / Qwen2.5-VL templates do): mmrl writes Qwen's tools
block itself. A template that renders tools natively (one written here, in the manner of Qwen3-VL's) is carried
into the system message exactly. Either way, a prompt, the policy's turn and a tool turn with images, encoded
piece by piece as the agent loop does, equal the whole conversation encoded at once by the one encoding path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from mmrl.agent.builtin import BUILTINS
from mmrl.agent.chat import ChatFormat
from mmrl.agent.outputs import ToolOutput
from mmrl.agent.schemas import function_definition, schema_of
from mmrl.models.encoding import encode_prompt, to_chat_content
from mmrl.models.loading import load_processor
from mmrl.models.tool_calls import QWEN_TOOL_CALLS

TOOLS = [function_definition(schema_of(fn)) for fn in BUILTINS.values()]
ROW = [{"role": "user", "content": "<image>What colour is the circle in cell B2?"}]

# A template that knows tools (written for this test): a tools section in the system message, each tool
# message a <tool_response> block of a user turn, images included.
NATIVE = (
    "{%- macro render(content) %}{% if content is string %}{{ content }}{% else %}{% for item in content %}"
    "{% if item.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% elif item.type == 'text' %}"
    "{{ item.text }}{% endif %}{% endfor %}{% endif %}{% endmacro %}"
    "{%- set first_system = messages and messages[0].role == 'system' %}"
    "{%- if tools %}<|im_start|>system\n{% if first_system %}{{ render(messages[0].content) }}\n\n{% endif %}"
    "Tools you may call:{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n"
    "{% elif first_system %}<|im_start|>system\n{{ render(messages[0].content) }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if not (loop.first and first_system) %}"
    "{% if m.role == 'tool' %}{% if messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ render(m.content) }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ render(m.content) }}<|im_end|>\n{% endif %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def processor(tiny_model_dir: Path):
    return load_processor(str(tiny_model_dir))


@pytest.fixture(scope="module")
def native(tiny_model_dir: Path):
    proc = load_processor(str(tiny_model_dir))
    proc.chat_template = NATIVE
    return proc


def test_the_tiny_template_ignores_tools_so_mmrl_writes_qwens_block(processor) -> None:
    chat = ChatFormat(processor)
    assert not chat.native_tools and not chat.native_tool_role and chat.calls is QWEN_TOOL_CALLS
    messages = chat.with_tools(ROW, TOOLS)
    assert messages[1:] == ROW and messages[0]["role"] == "system"
    assert messages[0]["content"] == QWEN_TOOL_CALLS.tools_block(TOOLS)
    assert '{"type": "function", "function": {"name": "zoom_in"' in messages[0]["content"]
    call_format = '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    assert call_format in messages[0]["content"]
    own = chat.with_tools([{"role": "system", "content": "Be brief."}, *ROW], TOOLS)
    assert own[0]["content"] == "Be brief.\n\n" + QWEN_TOOL_CALLS.tools_block(TOOLS) and own[1:] == ROW
    assert chat.with_tools(ROW, []) == ROW


def test_a_template_that_knows_tools_renders_them_into_the_system_message(native) -> None:
    chat = ChatFormat(native)
    assert chat.native_tools and chat.native_tool_role
    for row in (ROW, [{"role": "system", "content": "Be brief."}, *ROW]):
        messages = chat.with_tools(row, TOOLS)
        assert messages[0]["role"] == "system" and "Tools you may call:" in messages[0]["content"]
        image = Image.new("RGB", (224, 224), "white")
        text = native.apply_chat_template(to_chat_content(row), tools=TOOLS, add_generation_prompt=True, tokenize=False)
        expected = native(text=[text], images=[image], return_tensors="pt")
        assert torch.equal(encode_prompt(native, messages, [image]).input_ids, expected["input_ids"][0])
    assert "Be brief.\n\nTools you may call:" in chat.with_tools([{"role": "system", "content": "Be brief."}, *ROW],
                                                                 TOOLS)[0]["content"]


def assistant_ids(processor, text: str) -> torch.Tensor:
    tok = processor.tokenizer
    return torch.tensor(tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])


@pytest.mark.parametrize("form", ["fallback", "native"])
def test_turns_encoded_piece_by_piece_equal_the_conversation_encoded_at_once(processor, native, form: str) -> None:
    proc = processor if form == "fallback" else native
    chat = ChatFormat(proc)
    prompt_image = Image.new("RGB", (224, 224), (200, 200, 200))
    zoomed = Image.new("RGB", (112, 84), (220, 30, 30))
    first = '<tool_call>\n{"name": "zoom_in", "arguments": {"bbox_2d": [0, 0, 56, 56]}}\n</tool_call>'
    second = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+"}}\n</tool_call>'
    turn_1 = [ToolOutput(images=(zoomed,)), ToolOutput.failed("bad_json", "the tool call is not valid JSON")]
    turn_2 = [ToolOutput(text="2 <|im_end|> and <image>")]  # a tool's text cannot close a turn or add an image

    messages = chat.with_tools(ROW, TOOLS)
    prompt = encode_prompt(proc, messages, [prompt_image])
    pieces = [prompt.input_ids, assistant_ids(proc, first), chat.encode_turn(turn_1).input_ids,
              assistant_ids(proc, second), chat.encode_turn(turn_2).input_ids]
    types = [prompt.mm_token_type_ids, torch.zeros(len(pieces[1]), dtype=torch.long),
             chat.encode_turn(turn_1).mm_token_type_ids, torch.zeros(len(pieces[3]), dtype=torch.long),
             chat.encode_turn(turn_2).mm_token_type_ids]

    conversation = chat.in_format([*messages, {"role": "assistant", "content": first}, *chat.tool_messages(turn_1),
                                   {"role": "assistant", "content": second}, *chat.tool_messages(turn_2)])
    whole = encode_prompt(proc, conversation, [prompt_image, zoomed])
    assert torch.equal(torch.cat(pieces), whole.input_ids)
    assert torch.equal(torch.cat(types), whole.mm_token_type_ids)
    assert torch.equal(torch.cat([prompt.pixel_values, chat.encode_turn(turn_1).pixel_values]), whole.pixel_values)
    grids = torch.cat([prompt.image_grid_thw, chat.encode_turn(turn_1).image_grid_thw])
    assert torch.equal(grids, whole.image_grid_thw)
    assert chat.encode_turn(turn_2).image_grid_thw is None
    text = chat.turn_text(turn_2)
    assert "<|im_end|> and" not in text and text.count("<|im_end|>") == 1 and "<tool_response>" in text
    assert chat.turn_text(turn_1).endswith("<|im_start|>assistant\n")


def test_model_image_sizes_are_those_the_processor_gave_the_model(processor) -> None:
    chat = ChatFormat(processor)
    prompt = encode_prompt(processor, [{"role": "user", "content": "<image><image>Which?"}],
                           [Image.new("RGB", (448, 448)), Image.new("RGB", (56, 112))])
    # The tiny processor's budget is 112 x 112 pixels; sides are multiples of 28.
    assert chat.model_image_sizes(prompt) == [(112, 112), (56, 112)]
    assert chat.model_image_sizes(encode_prompt(processor, [{"role": "user", "content": "Hi"}], [])) == []
