""":class:`EncodedPrompt`: one prompt tokenised, its media processed, as every pass of the library takes it.

It is made by the one encoding path (:func:`mmrl.models.encoding.encode_prompt`) and by an agent's tool turns
(:meth:`mmrl.agent.chat.ChatFormat.encode_turn`); the families read it (:mod:`mmrl.models.families`) without
depending on the path that makes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from mmrl.schema import Video


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
