"""An episode's context, whose media are read through from its pieces, never copied: :class:`JoinedPrompt`.

An episode's context (:meth:`~mmrl.agent.episode.Episode.context`: the prompt of its next policy turn) and its
scoring context (:meth:`~mmrl.agent.episode.Episode.scoring_context`: the prompt its response is scored against)
hold the prompt's media followed by each tool turn's. A prompt's n episodes have one prompt encoding, so their
contexts keep references to their pieces (``media_parts``: the prompt's :class:`EncodedPrompt` itself, then each
tool turn's media) and give each media field (:data:`~mmrl.models.media.MEDIA_FIELDS`) as the pieces' values
joined when it is read:

- on the rank that runs the episodes, their contexts hold the prompt's pixels once, the prompt's own tensors (a
  context without tool media gives them as they are; one with tool media, a concatenation made when it is read);
- pickled together (a rank's samples going back to the driver; the driver's call to the rank that scores them),
  the prompt's encoding is one object, which pickle writes once: a group's contexts cost one copy of the prompt's
  pixels plus their tool turns', not n copies (the prompt's source images stay behind, as any
  :class:`EncodedPrompt`'s do);
- ``media_parts`` says, by identity, which pieces several contexts share: ``collate(share_media=True)`` reads it
  (:func:`~mmrl.models.encoding.media_pieces`), so the trainer's passes run a group's prompt images once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from PIL import Image

from mmrl.models.encoding import MEDIA_FIELDS, EncodedPrompt
from mmrl.schema import Video


def joined(parts: Sequence[EncodedPrompt], key: str) -> torch.Tensor | None:
    """One media field over ``parts`` in order: None when no part has it, the one part's own tensor when only one
    has it (no copy), else their concatenation along dim 0 (pixels (patches, ...) or tiles, grids (items, 3))."""
    present = [value for part in parts if (value := getattr(part, key)) is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else torch.cat(present)


def media_of(encoded: EncodedPrompt) -> EncodedPrompt:
    """A tool turn's media alone (no ids, no source images): its pixels and grids, the same tensors."""
    empty = torch.zeros(0, dtype=torch.long)
    return EncodedPrompt(input_ids=empty, mm_token_type_ids=empty, name=encoded.name,
                         **{key: getattr(encoded, key) for key in MEDIA_FIELDS})


def _media_field(key: str) -> property:
    return property(lambda self: joined(self.media_parts, key),
                    doc=f"``{key}`` of the pieces, joined in order (:func:`joined`).")


class JoinedPrompt(EncodedPrompt):
    """An :class:`EncodedPrompt` whose media fields are its ``media_parts``' joined in order (see the module's
    docstring). input_ids (T,) and mm_token_type_ids (T,) are its own; pixel_values, image_grid_thw (items, 3),
    pixel_values_videos, video_grid_thw and second_per_grid_ts are read through (a field of several pieces is a
    new tensor at each read: write into a piece, never into what a read gives); ``response_mm_types`` (R,) as an
    EncodedPrompt's.

    Made with ``media_parts``; made field by field instead (``dataclasses.replace``: every field of an
    EncodedPrompt, the media fields as read), its one piece holds the media given.
    """

    pixel_values = _media_field("pixel_values")
    image_grid_thw = _media_field("image_grid_thw")
    pixel_values_videos = _media_field("pixel_values_videos")
    video_grid_thw = _media_field("video_grid_thw")
    second_per_grid_ts = _media_field("second_per_grid_ts")

    def __init__(self, input_ids: torch.Tensor, mm_token_type_ids: torch.Tensor,
                 pixel_values: torch.Tensor | None = None, image_grid_thw: torch.Tensor | None = None,
                 pixel_values_videos: torch.Tensor | None = None, video_grid_thw: torch.Tensor | None = None,
                 second_per_grid_ts: torch.Tensor | None = None, source_images: Sequence[Image.Image] = (),
                 source_videos: Sequence[Video] = (), template_ids: Sequence[int] = (), name: str = "",
                 response_mm_types: torch.Tensor | None = None, *,
                 media_parts: Sequence[EncodedPrompt] | None = None) -> None:
        # Not the dataclass's __init__: the media fields are properties. Pickling keeps __dict__ (less the source
        # images, EncodedPrompt.__getstate__), so the pieces travel, not their concatenation.
        media = {"pixel_values": pixel_values, "image_grid_thw": image_grid_thw,
                 "pixel_values_videos": pixel_values_videos, "video_grid_thw": video_grid_thw,
                 "second_per_grid_ts": second_per_grid_ts}
        if media_parts is None:
            empty = torch.zeros(0, dtype=torch.long)
            media_parts = (EncodedPrompt(input_ids=empty, mm_token_type_ids=empty, name=name, **media),)
        elif any(value is not None for value in media.values()):
            raise ValueError(f"prompt {name}: a JoinedPrompt's media are its media_parts', not given field by field")
        self.input_ids, self.mm_token_type_ids = input_ids, mm_token_type_ids
        self.media_parts: tuple[EncodedPrompt, ...] = tuple(media_parts)
        self.source_images, self.source_videos = list(source_images), list(source_videos)
        self.template_ids, self.name, self.response_mm_types = list(template_ids), name, response_mm_types

    def __repr__(self) -> str:
        return f"JoinedPrompt(name={self.name!r}, tokens={len(self)}, parts={len(self.media_parts)})"
