"""The ONE multimodal encoding path: messages + images -> model inputs.

Rollout, log-prob passes, training and evaluation all call :func:`encode_prompt` once per prompt and
:func:`collate` to build a padded batch, so image tokens, grids, ``mm_token_type_ids`` and hence
Qwen's mrope position ids can never disagree between generation and training.

Layout of a collated batch of B sequences (P = longest prompt, R = response width)::

    [pad ... pad | prompt tokens | response tokens | pad ... pad]
     <-- left padding, P in all --> <------------ R ------------>

Logits at positions ``P-1 .. P+R-2`` predict the R response tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

# The one definition of the placeholder and its counter, shared with data prep.
from data_prep.schema import IMAGE_PLACEHOLDER, count_placeholders
VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


@dataclass(eq=False)
class EncodedPrompt:
    """One prompt, tokenised and with its pixels processed.

    input_ids: (P,) int64, the image placeholders expanded to one token per image feature;
    mm_token_type_ids: (P,) int64 (1 on image tokens); pixel_values: (num_patches, C*T*patch*patch) or
    None; image_grid_thw: (num_images, 3) or None.

    ``source_images`` are the PIL images the processor was given, for an engine that processes media
    itself (vLLM). They exist only in the process that encoded the prompt: pickling drops them, because
    the processed patches are what the trainer needs and what travels. ``name`` identifies the prompt in
    error messages (its row id).
    """

    input_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    source_images: list[Image.Image] = field(default_factory=list)
    name: str = ""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "source_images": []}


def to_chat_content(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Turn ``<image>`` placeholders inside message strings into Qwen content items, in order."""
    converted = []
    for message in messages:
        content = message["content"]
        if not isinstance(content, str):
            converted.append(dict(message))
            continue
        items: list[dict[str, Any]] = []
        for i, text in enumerate(content.split(IMAGE_PLACEHOLDER)):
            if i > 0:
                items.append({"type": "image"})
            if text:
                items.append({"type": "text", "text": text})
        converted.append({"role": message["role"], "content": items})
    return converted


def encode_prompt(
    processor: Any, messages: Sequence[dict[str, Any]], images: Sequence[Image.Image], name: str = ""
) -> EncodedPrompt:
    """Apply the chat template (with the generation prompt) and the image processor to one prompt."""
    if count_placeholders(messages) != len(images):
        raise ValueError(
            f"prompt has {count_placeholders(messages)} {IMAGE_PLACEHOLDER} placeholders but {len(images)} "
            "images; put one placeholder where each image goes"
        )
    text = processor.apply_chat_template(to_chat_content(messages), add_generation_prompt=True, tokenize=False)
    out = processor(text=[text], images=list(images) or None, return_tensors="pt", return_mm_token_type_ids=True)
    return EncodedPrompt(
        input_ids=out["input_ids"][0],
        mm_token_type_ids=out["mm_token_type_ids"][0],
        pixel_values=out.get("pixel_values"),
        image_grid_thw=out.get("image_grid_thw"),
        source_images=list(images),
        name=name,
    )


def collate(
    prompts: Sequence[EncodedPrompt],
    pad_token_id: int,
    responses: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Left-pad prompts to one length P and append right-padded responses.

    prompts: B encoded prompts (the same object may appear several times).
    responses: (B, R) int64 or None; response_mask: (B, R), 1 on real response tokens.
    Returns model kwargs: input_ids (B, P+R), attention_mask (B, P+R), mm_token_type_ids (B, P+R),
    and, when any prompt has images, pixel_values (sum of patches, D) and image_grid_thw (num_images, 3),
    concatenated in sample order.
    """
    num = len(prompts)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((num, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((num, width), dtype=torch.long)
    mm_types = torch.zeros((num, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        length = len(prompt)
        input_ids[row, width - length :] = prompt.input_ids
        attention[row, width - length :] = 1
        mm_types[row, width - length :] = prompt.mm_token_type_ids
    if responses is not None:
        if response_mask is None:
            raise ValueError("collate: responses need a response_mask")
        input_ids = torch.cat([input_ids, responses.long()], dim=1)
        attention = torch.cat([attention, response_mask.long()], dim=1)
        mm_types = torch.cat([mm_types, torch.zeros_like(responses, dtype=torch.long)], dim=1)
    batch = {"input_ids": input_ids, "attention_mask": attention, "mm_token_type_ids": mm_types}
    with_pixels = [p for p in prompts if p.pixel_values is not None]
    if with_pixels:
        batch["pixel_values"] = torch.cat([p.pixel_values for p in with_pixels])
        batch["image_grid_thw"] = torch.cat([p.image_grid_thw for p in with_pixels])
    return batch


def vision_token_ids(tokenizer: Any) -> list[int]:
    """Ids of the tokens a policy must never emit (they would desynchronise image features)."""
    ids = [tokenizer.convert_tokens_to_ids(tok) for tok in VISION_TOKENS]
    return [i for i in ids if i is not None and i != tokenizer.unk_token_id]
