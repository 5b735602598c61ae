"""The tools in the system prompt, and a tool turn in the family's chat format, encoded by the one path.

A chat template knows tools in one of two ways:

- **natively**: ``apply_chat_template(..., tools=...)`` writes them into the system message (Qwen3-VL's
  template, Qwen2.5's text models'), and renders role ``tool`` messages;
- **not at all**: it ignores ``tools`` (the published Qwen2-VL, Qwen2.5-VL and SmolVLM templates, and the tiny
  models'). Then mmrl writes the tools block into the system message itself, in the family's tool-call format
  (:attr:`ChatFormat.calls`, :mod:`mmrl.models.tool_calls`), and renders each run of tool turns as one user turn
  of the format's tool responses. For every family today that is Qwen's format: the tools block the native
  Qwen templates write, and ``<tool_response>`` blocks, which is how they render role ``tool``.

Either way :class:`ChatFormat` returns plain conversation messages (string contents with ``<image>``
placeholders, as in the data rows) that :func:`~mmrl.models.encoding.encode_prompt` encodes: with tools,
exactly what the template renders with ``tools=`` (checked on every prompt). A tool turn is encoded as the
text between the policy's end-of-turn token and the next generation prompt (:meth:`ChatFormat.turn_text`), by
the family's own encoder, so its image tokens and pixels are made as a prompt's are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from PIL import Image

from mmrl.agent.outputs import ToolOutput
from mmrl.models.encoding import EncodedPrompt, to_chat_content
from mmrl.models.families import family_of_processor
from mmrl.models.tool_calls import ToolCallFormat
from mmrl.plugins.safe_text import made_safe, reserved_strings
from mmrl.schema import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER

_MARK = "\x00mmrl-system\x00"  # stands for the system message's content while its place is found
_PROBE = {"type": "function", "function": {"name": "mmrl_probe", "description": "probe",
                                           "parameters": {"type": "object", "properties": {}}}}


class ChatFormat:
    """One processor's chat format for tools: how tools enter the system prompt and how a tool turn reads."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.family = family_of_processor(processor)
        self.calls: ToolCallFormat = self.family.tool_calls
        """The family's tool-call format: how the policy writes calls, and the tools block and tool responses
        mmrl writes where the template does not."""
        tokenizer = processor.tokenizer
        if tokenizer("x")["input_ids"] != tokenizer("x", add_special_tokens=False)["input_ids"]:
            raise ValueError(f"the {self.family.name} tokenizer adds special tokens to every text it encodes; a tool "
                             "turn could not be encoded apart from the prompt")
        self.eos = tokenizer.eos_token
        self.reserved = reserved_for(processor)
        """The strings a tool's text must not hold (:func:`reserved_for`)."""
        self.native_tools = self._render([{"role": "user", "content": "u"}], [_PROBE]) != self._render(
            [{"role": "user", "content": "u"}])
        self.native_tool_role = self.native_tools and self._tool_role_takes_images()

    # ---- the system prompt ---------------------------------------------------------------------

    def with_tools(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` (a data row's) with ``tools`` (:meth:`mmrl.agent.table.ToolTable.definitions`) in the system
        message; no tools: unchanged. Raises ValueError where the result would not encode as the template
        renders the conversation with ``tools=``."""
        messages = [dict(m) for m in messages]
        if not tools:
            return messages
        has_system = bool(messages) and messages[0]["role"] == "system"
        rest = messages[1:] if has_system else messages
        if self.native_tools:
            system = self._native_system(messages, rest, tools)
        else:
            system = (messages[0]["content"] + "\n\n" if has_system else "") + self.calls.tools_block(tools)
        out = [{"role": "system", "content": system}, *rest]
        if self.native_tools and self._chat_text(out) != self._render(messages, tools):
            raise ValueError(f"the {self.family.name} chat template renders tools in a form mmrl cannot carry in the "
                             "system message; give the processor a template without tool support (mmrl then writes "
                             "the tools block itself)")
        return out

    def _native_system(self, messages: list[dict[str, Any]], rest: list[dict[str, Any]],
                       tools: Sequence[dict[str, Any]]) -> str:
        """The system message content that renders, without ``tools=``, what the template renders with them."""
        rendered = self._render(messages, tools)
        head, _, tail = self._render([{"role": "system", "content": _MARK}, *rest]).partition(_MARK)
        if not rendered.startswith(head) or not rendered.endswith(tail) or len(head) + len(tail) > len(rendered):
            raise ValueError(f"the {self.family.name} chat template writes tools outside the system message; mmrl "
                             "cannot encode them")
        return rendered[len(head): len(rendered) - len(tail)]

    # ---- tool turns ----------------------------------------------------------------------------

    def safe(self, output: ToolOutput) -> ToolOutput:
        """``output`` with its text made safe (:meth:`neutral`), ``unsafe_text`` among its repairs if that
        changed it."""
        text = self.neutral(output.text)
        if text == output.text:
            return output
        return dataclasses.replace(output, text=text, repairs=tuple(dict.fromkeys((*output.repairs, "unsafe_text"))))

    def tool_messages(self, outputs: Sequence[ToolOutput]) -> list[dict[str, Any]]:
        """One ``tool`` message per call's output: an ``<image>`` placeholder per image, then its text
        (made safe, :meth:`neutral`: a tool cannot end a turn, open an image slot or stop the tokenizer)."""
        return [{"role": "tool", "content": IMAGE_PLACEHOLDER * len(o.images) + self.neutral(o.text)} for o in outputs]

    def in_format(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """A conversation whose ``tool`` messages are put in the template's form: kept as they are where the
        template renders tool turns natively, else each run of them merged into one user message of the
        format's tool responses (:meth:`~mmrl.models.tool_calls.ToolCallFormat.tool_responses`). (Data rows of
        demonstrations are encoded through this.)"""
        if self.native_tool_role:
            return [dict(m) for m in messages]
        out: list[dict[str, Any] | list[str]] = []  # a message, or a run of tool messages' contents
        for message in messages:
            if message["role"] != "tool":
                out.append({"role": message["role"], "content": message["content"]})
            elif out and isinstance(out[-1], list):
                out[-1].append(message["content"])
            else:
                out.append([message["content"]])
        return [m if isinstance(m, dict) else {"role": "user", "content": self.calls.tool_responses(m)} for m in out]

    def turn_text(self, outputs: Sequence[ToolOutput]) -> str:
        """The text after the policy's end-of-turn token up to and including the next generation prompt, for a
        tool turn of ``outputs`` (images as the template writes them, before the processor expands them)."""
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        before = self._render(base, generation=False)
        after = self._render(self.in_format(base + self.tool_messages(outputs)), generation=True)
        cut = before.rfind(self.eos) + len(self.eos)
        if not before[:cut].endswith("a" + self.eos) or after[:cut] != before[:cut]:
            raise ValueError(f"the {self.family.name} chat template does not end an assistant turn with its "
                             f"end-of-turn token {self.eos!r}; mmrl cannot append a tool turn after it")
        return after[cut:]

    def encode_turn(self, outputs: Sequence[ToolOutput], name: str = "") -> EncodedPrompt:
        """A tool turn encoded as a prompt piece: input_ids (T,) with each image expanded, mm_token_type_ids (T,),
        the images' pixels and grids (as :func:`~mmrl.models.encoding.encode_prompt` makes them)."""
        text = self.turn_text(outputs)
        images = [image for o in outputs for image in o.images]
        return EncodedPrompt(**self.family.encode(self.processor, text, images, []), source_images=images,
                             template_ids=list(self.processor.tokenizer(text)["input_ids"]), name=name)

    def model_image_sizes(self, encoded: EncodedPrompt) -> list[tuple[int, int]]:
        """Per image of ``encoded``, the (width, height) in pixels the model sees it at (its grid's cells)."""
        if encoded.image_grid_thw is None:
            return []
        side = self.family.grid_pixels(self.processor)
        return [(int(w) * side, int(h) * side) for _, h, w in encoded.image_grid_thw.tolist()]

    def neutral(self, text: str) -> str:
        """``text`` cleaned (valid Unicode, no control characters or terminal escapes) and with every special
        token, media token and placeholder replaced by a space until none is left
        (:func:`mmrl.plugins.safe_text.made_safe`)."""
        return made_safe(text, self.reserved)

    # ---- rendering -----------------------------------------------------------------------------

    def _render(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None,
                generation: bool = True) -> str:
        return self.processor.apply_chat_template(to_chat_content(messages), tools=list(tools) if tools else None,
                                                  add_generation_prompt=generation, tokenize=False)

    def _chat_text(self, messages: Sequence[dict[str, Any]]) -> str:
        """What :func:`~mmrl.models.encoding.encode_prompt` renders for ``messages``."""
        return self.family.chat_text(self.processor, to_chat_content(messages))

    def _tool_role_takes_images(self) -> bool:
        """Whether the template renders an image in a ``tool`` message (so that the processor finds it)."""
        probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                 {"role": "tool", "content": IMAGE_PLACEHOLDER}]
        try:
            text = self._render(probe)
            out = self.family.encode(self.processor, text, [Image.new("RGB", (28, 28))], [])
        except Exception:  # noqa: BLE001 - any failure means: not in this form
            return False
        return out.get("image_grid_thw") is not None


def reserved_for(processor: Any) -> tuple[str, ...]:
    """What text from outside (a tool's, a response shown to a judge) must not hold to be encoded by ``processor``
    as plain text: its special tokens, its family's vision tokens and mmrl's media placeholders."""
    vision = family_of_processor(processor).vision_tokens(processor.tokenizer)
    return reserved_strings(processor, [*vision, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER])
