"""The ONE multimodal encoding path: messages + images + videos -> model inputs.

Rollout, log-prob passes, training and evaluation all call :func:`encode_prompt` once per prompt and
:func:`collate` to build a padded batch, so media tokens, grids, ``mm_token_type_ids``, the videos' time
steps and hence the position ids (3-D for some families) can never disagree between generation and training.
What differs per model family (the processor's arguments, the pixels' form) is the family's
:meth:`~mmrl.models.families.base.Family.encode`; the family is the processor's (:func:`family_of_processor`).
What is the same for every family (the placeholders, the videos' frames, the media fields) is
:mod:`mmrl.models.media`'s.

Layout of a collated batch of B sequences (P = longest prompt, R = response width)::

    [pad ... pad | prompt tokens | response tokens | pad ... pad]
     <-- left padding, P in all --> <------------ R ------------>

Logits at positions ``P-1 .. P+R-2`` predict the R response tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

from mmrl.models.families import family_of_processor

# The media forms and the prompt type live in their own modules; those that callers import from here are
# re-exported (__all__).
from mmrl.models.media import (
    MEDIA_FIELDS,
    MEDIA_KINDS,
    check_placeholders,
    frames_array,
    shared_keys,
    to_chat_content,
    video_metadata,
)
from mmrl.models.prompt import EncodedPrompt
from mmrl.schema import Video

__all__ = ["MEDIA_FIELDS", "EncodedPrompt", "PromptParts", "collate", "encode_prompt", "encode_prompts", "frames_array",
           "media_grids", "response_media_types", "to_chat_content", "video_metadata", "vision_token_ids"]


def encode_prompt(
    processor: Any,
    messages: Sequence[dict[str, Any]],
    images: Sequence[Image.Image],
    videos: Sequence[Video] = (),
    name: str = "",
) -> EncodedPrompt:
    """Apply the chat template (with the generation prompt) and the image and video processors to one prompt."""
    return encode_prompts(processor, [PromptParts(messages, images, videos, name)])[0]


@dataclass(frozen=True)
class PromptParts:
    """One prompt before encoding: its chat ``messages`` (``<image>`` / ``<video>`` placeholders), its media and
    the ``name`` its errors give."""

    messages: Sequence[dict[str, Any]]
    images: Sequence[Image.Image] = ()
    videos: Sequence[Video] = ()
    name: str = ""


def encode_prompts(processor: Any, prompts: Sequence[PromptParts]) -> list[EncodedPrompt]:
    """:func:`encode_prompt` of several prompts, the processor run once on all of them where the family can
    (:meth:`~mmrl.models.families.base.Family.encode_many`): the same encodings as one call each."""
    if not prompts:
        return []
    family = family_of_processor(processor)
    texts = []
    for p in prompts:
        check_placeholders(p.messages, p.images, p.videos, p.name)
        if p.videos and not family.takes_video:
            raise ValueError(f"prompt {p.name or ''} has a video, but {family.name} models take no video input")
        texts.append(family.chat_text(processor, to_chat_content(p.messages)))
    fields = family.encode_many(processor, texts, [p.images for p in prompts], [p.videos for p in prompts])
    templates = processor.tokenizer(texts)["input_ids"]
    return [EncodedPrompt(**f, source_images=list(p.images), source_videos=list(p.videos), template_ids=list(ids),
                          name=p.name) for p, f, ids in zip(prompts, fields, templates, strict=True)]


def collate(
    prompts: Sequence[EncodedPrompt],
    pad_token_id: int,
    responses: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
    share_media: bool = False,
) -> dict[str, torch.Tensor]:
    """Left-pad prompts to one length P and append right-padded responses.

    prompts: B encoded prompts (the same object may appear several times, e.g. the n samples of a prompt).
    share_media: send each distinct prompt's pixels once (the n samples of a prompt then cost one vision
    pass, not n): ``pixel_values`` / ``pixel_values_videos`` hold the distinct prompts' media only, and
    :func:`shared_keys` give their grids and, for every image / video of the batch, which distinct one it is
    (the grids themselves stay per sample: the 3-D positions need them). Only
    :func:`mmrl.models.forward.encode_media` reads that form; ``model(**inputs)`` does not.
    responses: (B, R) int64 or None; response_mask: (B, R), 1 on real response tokens. A prompt with
    ``response_mm_types`` gives its row's response part those media token types (the first R of them).
    Returns model kwargs: input_ids (B, P+R), attention_mask (B, P+R), mm_token_type_ids (B, P+R), and
    each media field of :data:`MEDIA_FIELDS` that any prompt has, concatenated in sample order.
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
        mm_types = torch.cat([mm_types, response_media_types(prompts, responses.shape[1])], dim=1)
    batch = {"input_ids": input_ids, "attention_mask": attention, "mm_token_type_ids": mm_types}
    for key in MEDIA_FIELDS:
        present = [getattr(p, key) for p in prompts if getattr(p, key) is not None]
        if present:
            batch[key] = torch.cat(present)
    if share_media:
        batch.update(_distinct_media(prompts))
    return batch


def response_media_types(prompts: Sequence[EncodedPrompt], width: int) -> torch.Tensor:
    """(B, width) int64: each row's response media token types (0 text; a context's
    ``response_mm_types`` where it has them), cut or zero-padded to ``width``."""
    types = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt.response_mm_types is not None:
            known = prompt.response_mm_types[:width]
            types[row, : len(known)] = known
    return types


def media_grids(prompt: EncodedPrompt) -> list[tuple[int, int, int]]:
    """The (t, h, w) grids of the items a prompt's vision tower runs on: its images', then its videos'."""
    return [(int(t), int(h), int(w)) for grids in (prompt.image_grid_thw, prompt.video_grid_thw)
            if grids is not None for t, h, w in grids.tolist()]


def media_pieces(prompt: EncodedPrompt) -> tuple[EncodedPrompt, ...]:
    """The objects whose media make up ``prompt``'s, in order: an agent episode's context's ``media_parts`` (its
    prompt, then each tool turn's media: :class:`~mmrl.agent.context.JoinedPrompt`), else the prompt itself."""
    return tuple(getattr(prompt, "media_parts", None) or (prompt,))


def _distinct_media(prompts: Sequence[EncodedPrompt]) -> dict[str, torch.Tensor]:
    """The pixels of each distinct media piece (by identity: a prompt, or a piece of an episode's context, so that a
    group's episodes share their prompt's) once, their grids, and item -> distinct item maps."""
    pieces = [piece for p in prompts for piece in media_pieces(p)]
    distinct = list({id(p): p for p in pieces}.values())
    out: dict[str, torch.Tensor] = {}
    for kind, pixels_key, grid_key in MEDIA_KINDS:
        grids = [getattr(p, grid_key) for p in distinct if getattr(p, grid_key) is not None]
        if not grids:
            continue
        first = {}  # id(piece) -> index of its first item among the distinct items
        count = 0
        for p in distinct:
            grid = getattr(p, grid_key)
            if grid is not None:
                first[id(p)] = count
                count += grid.shape[0]
        index = [first[id(p)] + j for p in pieces if getattr(p, grid_key) is not None
                 for j in range(getattr(p, grid_key).shape[0])]
        grid_distinct, index_key = shared_keys(kind)
        out[pixels_key] = torch.cat([getattr(p, pixels_key) for p in distinct if getattr(p, grid_key) is not None])
        out[grid_distinct] = torch.cat(grids)
        out[index_key] = torch.tensor(index, dtype=torch.long)
    return out


def vision_token_ids(processor: Any) -> list[int]:
    """Ids of the tokens a policy must never emit (they would desynchronise the media features): the
    processor's family's vision tokens (:meth:`~mmrl.models.families.base.Family.vision_tokens`)."""
    tokenizer = processor.tokenizer
    ids = [tokenizer.convert_tokens_to_ids(tok) for tok in family_of_processor(processor).vision_tokens(tokenizer)]
    return [i for i in ids if i is not None and i != tokenizer.unk_token_id]
