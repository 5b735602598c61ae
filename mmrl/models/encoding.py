"""The ONE multimodal encoding path: messages + images + videos -> model inputs.

Rollout, log-prob passes, training and evaluation all call :func:`encode_prompt` once per prompt and
:func:`collate` to build a padded batch, so media tokens, grids, ``mm_token_type_ids``, the videos' time
steps and hence the position ids (3-D for some families) can never disagree between generation and training.
What differs per model family (the processor's arguments, the pixels' form) is the family's
:meth:`~mmrl.models.families.base.Family.encode`; the family is the processor's (:func:`family_of_processor`).

Layout of a collated batch of B sequences (P = longest prompt, R = response width)::

    [pad ... pad | prompt tokens | response tokens | pad ... pad]
     <-- left padding, P in all --> <------------ R ------------>

Logits at positions ``P-1 .. P+R-2`` predict the R response tokens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

# Per kind of media: the pixels field and the grids field (with shared media, collate(share_media=True) adds
# two keys per kind, :func:`shared_keys`: the grids of the distinct items, and which distinct item each is).
from mmrl.models.families import MEDIA_KINDS, family_of_processor, shared_keys

# The one definition of the placeholders and their counter, shared with data prep.
from mmrl.schema import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, Video, count_placeholders

_PLACEHOLDER = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})")
# Media fields of an EncodedPrompt: concatenated over the samples of a batch, in sample order.
MEDIA_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


@dataclass(eq=False)
class EncodedPrompt:
    """One prompt, tokenised and with its media processed.

    input_ids: (P,) int64, each media placeholder expanded to one token per vision feature;
    mm_token_type_ids: (P,) int64 (0 text, 1 image, 2 video); pixel_values: the images' pixels in the form the
    family's tower takes (flattened patches (patches, C*T*patch*patch), or whole tiles (tiles, C, H, W)) or
    None; image_grid_thw: (num_images, 3) or None, each image's (t, h, w) grid; pixel_values_videos,
    video_grid_thw: the same for videos; second_per_grid_ts: (num_videos,) float, the seconds one temporal
    grid step spans (for the time axis of the positions).

    ``source_images`` / ``source_videos`` are the media the processor was given, and ``template_ids`` the
    prompt's ids before the processor expanded its media placeholders, for an engine that processes media
    itself (vLLM). They exist only in the process that encoded the prompt: pickling drops them, because the
    processed pixels are what the trainer needs and what travels. ``name`` identifies the prompt in error
    messages (its row id).

    ``response_mm_types`` (R,) int64, set only on one sample's own context (an agent episode's prompt with the
    media of its tool turns appended, :meth:`mmrl.agent.episode.Episode.scoring_context`): the media token
    types of that sample's response, whose tool turns hold image tokens. None: a response of text only.
    """

    input_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    pixel_values_videos: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    second_per_grid_ts: torch.Tensor | None = None
    source_images: list[Image.Image] = field(default_factory=list)
    source_videos: list[Video] = field(default_factory=list)
    template_ids: list[int] = field(default_factory=list)
    name: str = ""
    response_mm_types: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "source_images": [], "source_videos": [], "template_ids": []}


def to_chat_content(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Turn ``<image>`` / ``<video>`` placeholders inside message strings into chat content items, in order."""
    kinds = {IMAGE_PLACEHOLDER: "image", VIDEO_PLACEHOLDER: "video"}
    converted = []
    for message in messages:
        content = message["content"]
        if not isinstance(content, str):
            converted.append(dict(message))
            continue
        items = [{"type": kinds[part]} if part in kinds else {"type": "text", "text": part}
                 for part in _PLACEHOLDER.split(content) if part]
        converted.append({"role": message["role"], "content": items})
    return converted


def video_metadata(video: Video) -> dict[str, Any]:
    """What the processor needs to know of already-sampled frames (no resampling, their real rate)."""
    count = len(video.frames)
    return {"total_num_frames": count, "fps": video.fps, "frames_indices": list(range(count)),
            "duration": count / video.fps, "video_backend": "opencv"}


def frames_array(video: Video) -> np.ndarray:
    """(T, H, W, 3) uint8."""
    return np.stack([np.asarray(frame.convert("RGB")) for frame in video.frames])


def encode_prompt(
    processor: Any,
    messages: Sequence[dict[str, Any]],
    images: Sequence[Image.Image],
    videos: Sequence[Video] = (),
    name: str = "",
) -> EncodedPrompt:
    """Apply the chat template (with the generation prompt) and the image and video processors to one prompt."""
    for placeholder, media, kind in ((IMAGE_PLACEHOLDER, images, "image"), (VIDEO_PLACEHOLDER, videos, "video")):
        if count_placeholders(messages, placeholder) != len(media):
            raise ValueError(
                f"prompt {name or ''} has {count_placeholders(messages, placeholder)} {placeholder} placeholders but "
                f"{len(media)} {kind}s; put one placeholder where each {kind} goes"
            )
    family = family_of_processor(processor)
    text = family.chat_text(processor, to_chat_content(messages))
    if videos and not family.takes_video:
        raise ValueError(f"prompt {name or ''} has a video, but {family.name} models take no video input")
    return EncodedPrompt(
        **family.encode(processor, text, images, videos),
        source_images=list(images),
        source_videos=list(videos),
        template_ids=list(processor.tokenizer(text)["input_ids"]),
        name=name,
    )


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


def _distinct_media(prompts: Sequence[EncodedPrompt]) -> dict[str, torch.Tensor]:
    """The pixels of each distinct prompt (by identity) once, their grids, and item -> distinct item maps."""
    distinct = list({id(p): p for p in prompts}.values())
    out: dict[str, torch.Tensor] = {}
    for kind, pixels_key, grid_key in MEDIA_KINDS:
        grids = [getattr(p, grid_key) for p in distinct if getattr(p, grid_key) is not None]
        if not grids:
            continue
        first = {}  # id(prompt) -> index of its first item among the distinct items
        count = 0
        for p in distinct:
            grid = getattr(p, grid_key)
            if grid is not None:
                first[id(p)] = count
                count += grid.shape[0]
        index = [first[id(p)] + j for p in prompts if getattr(p, grid_key) is not None
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
