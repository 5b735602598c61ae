"""A prompt's media on the model side: from a data row's fields to the processor's inputs and the model's keys.

Everything here is the same for every model family; what a family does with the media (its processor's
arguments, the pixels' form, the vision tower) is its own module's (:mod:`mmrl.models.families`).

- **Rows**: a prompt row carries its media as :data:`MEDIA_KEYS` (``messages`` with ``<image>`` / ``<video>``
  placeholders, ``images``, ``videos``); :func:`check_placeholders` holds one placeholder per item and
  :func:`to_chat_content` turns the placeholders into the chat template's content items.
- **Videos**: frames already sampled and sized by data prep go to a processor as one (T, H, W, 3) array
  (:func:`frames_array`) with :func:`video_metadata`, so that it neither resamples nor re-times them.
- **Model inputs**: an encoded prompt and a collated batch hold each kind's pixels and grids under
  :data:`MEDIA_KINDS`' keys (:data:`MEDIA_FIELDS` in all); with shared media a batch adds
  :func:`shared_keys`; :func:`present_media` reads them back per kind for a vision pass, and
  :data:`PIXEL_KEYS` are the keys only the vision pass reads.

Pixel budgets are applied before any of this, when the data is prepared (:mod:`data_prep.pixels`, with the
factor the processor's family gives, :func:`mmrl.models.loading.patch_factor`): the processors here are
handed images and frames that fit already.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from mmrl.schema import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, Video, count_placeholders

# A prompt row's media as the driver holds it: what a rank needs to encode a prompt it does not hold yet.
MEDIA_KEYS = ("messages", "images", "videos")
# Media kinds, each with its pixels field and its grids field of an EncodedPrompt / a collated batch.
MEDIA_KINDS = (("image", "pixel_values", "image_grid_thw"), ("video", "pixel_values_videos", "video_grid_thw"))
# Media fields of an EncodedPrompt: concatenated over the samples of a batch, in sample order.
MEDIA_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
_PLACEHOLDER = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})")


def shared_keys(kind: str) -> tuple[str, str]:
    """The keys ``collate(share_media=True)`` adds for ``kind``: distinct grids (N, 3), item -> distinct (M,)."""
    return f"{kind}_grid_thw_distinct", f"{kind}_distinct_index"


# The keys of collated inputs that only the vision pass reads (the grids stay for the positions).
PIXEL_KEYS = ("pixel_values", "pixel_values_videos", *shared_keys("image"), *shared_keys("video"))


def check_placeholders(messages: Sequence[dict[str, Any]], images: Sequence[Any], videos: Sequence[Any],
                       name: str = "") -> None:
    """Raise ValueError unless ``messages`` hold one ``<image>`` per image and one ``<video>`` per video."""
    for placeholder, media, kind in ((IMAGE_PLACEHOLDER, images, "image"), (VIDEO_PLACEHOLDER, videos, "video")):
        if count_placeholders(messages, placeholder) != len(media):
            raise ValueError(
                f"prompt {name or ''} has {count_placeholders(messages, placeholder)} {placeholder} placeholders but "
                f"{len(media)} {kind}s; put one placeholder where each {kind} goes"
            )


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
    """A video's T frames -> (T, H, W, 3) uint8."""
    return np.stack([np.asarray(frame.convert("RGB")) for frame in video.frames])


def present_media(inputs: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """(kind, pixels, grids of the pixels' items, item -> pixel item index or None) for each kind in ``inputs``.

    With shared media (``collate(share_media=True)``) the pixels hold each distinct item once, the grids are the
    distinct items' (N, 3) and the index (M,) says which distinct item each of the batch's M items is;
    otherwise the grids are the items' own (M, 3) and the index is None.
    """
    out = []
    for kind, pixels_key, grid_key in MEDIA_KINDS:
        if inputs.get(pixels_key) is None:
            continue
        distinct, index = shared_keys(kind)
        out.append((kind, inputs[pixels_key], inputs.get(distinct, inputs[grid_key]), inputs.get(index)))
    return out
