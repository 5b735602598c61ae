"""Qwen2-VL / Qwen2.5-VL 3-D (mrope) position ids that continue after a video the way Qwen and vLLM do.

Why: in transformers 5.x (pinned 5.19) ``get_rope_index`` moves the text position after a media block on
by ``max(h, w) / merge``, ignoring the block's time extent. Qwen's original implementation, which the
released checkpoints were trained with, and vLLM continue from the block's largest position plus one.
For an image (one time step) the two agree; after a video, whose time steps are spread by
``second_per_grid_ts * tokens_per_second`` (Qwen2.5-VL), they do not: the trainer would score the
responses with other positions than vLLM sampled them with (measured: log-probs apart by 8e-4 on the tiny
model, 5e-7 for images), and a real checkpoint would see positions it never saw in training.

What: :func:`apply` replaces ``get_rope_index`` of ``Qwen2VLModel`` and ``Qwen2_5_VLModel`` with
:func:`rope_index`, written here from the algorithm: text tokens advance all three axes together; a media
item of grid (t, h, w) puts its merged tokens at (time index x time step, row, column) offset by the
position reached so far; the next token starts at the item's largest position plus one. It is applied by
:func:`mmrl.models.loading.load_model` and tested in tests/unit/test_patches.py (hand-computed positions)
and tests/integration/test_vllm_engine.py (vLLM's log-probs on video prompts).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

TEXT, IMAGE, VIDEO = 0, 1, 2


def item_positions(start: int, grid_thw: list[int], merge: int, time_step: float) -> torch.Tensor:
    """(3, t * h/merge * w/merge) positions of one image or video whose first token follows ``start``."""
    t, h, w = grid_thw[0], grid_thw[1] // merge, grid_thw[2] // merge
    times = (torch.arange(t, dtype=torch.float64) * time_step).long()
    grid_t, grid_h, grid_w = torch.meshgrid(times, torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([grid_t, grid_h, grid_w]).reshape(3, -1) + start


def sequence_positions(types: list[int], grids: dict[int, Iterator[list[int]]], seconds: Iterator[float],
                       merge: int, tokens_per_second: float | None) -> torch.Tensor:
    """(3, n) positions of one unpadded sequence; ``types`` gives each token's kind (text, image, video).

    ``grids`` yields the (t, h, w) of each image / video in order; ``seconds`` the time span of one temporal
    grid step of each video; ``tokens_per_second`` None means time steps are not scaled (Qwen2-VL).
    """
    pieces: list[torch.Tensor] = []
    position, index = 0, 0
    while index < len(types):
        kind, run = types[index], 1
        while index + run < len(types) and types[index + run] == kind:
            run += 1
        if kind == TEXT:
            pieces.append(torch.arange(position, position + run).expand(3, -1))
            position += run
        else:
            covered = 0
            while covered < run:  # a run may hold several items placed back to back
                grid = next(grids[kind])
                step = next(seconds) * tokens_per_second if kind == VIDEO and tokens_per_second is not None else 1.0
                item = item_positions(position, grid, merge, step)
                pieces.append(item)
                position = int(item.max()) + 1
                covered += item.shape[1]
            if covered != run:
                raise ValueError(f"a run of {run} media tokens does not match its grids ({covered} tokens)")
        index += run
    return torch.cat(pieces, dim=1)


def rope_index(
    self: Any,
    input_ids: torch.Tensor,
    mm_token_type_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model method: position_ids (3, B, L) and mrope deltas (B, 1); padding keeps position 0."""
    vision = self.config.vision_config
    merge = vision.spatial_merge_size
    tokens_per_second = getattr(vision, "tokens_per_second", None)
    grids = {IMAGE: iter(image_grid_thw.tolist() if image_grid_thw is not None else []),
             VIDEO: iter(video_grid_thw.tolist() if video_grid_thw is not None else [])}
    seconds = iter(second_per_grid_ts.tolist() if second_per_grid_ts is not None else [])
    if tokens_per_second is not None and video_grid_thw is not None and second_per_grid_ts is None:
        seconds = iter([1.0] * len(video_grid_thw))
    position_ids = torch.zeros(3, *input_ids.shape, dtype=input_ids.dtype, device=input_ids.device)
    deltas = []
    for row in range(input_ids.shape[0]):
        valid = attention_mask[row].bool() if attention_mask is not None else torch.ones_like(input_ids[row]).bool()
        types = mm_token_type_ids[row][valid].tolist()
        positions = sequence_positions(types, grids, seconds, merge, tokens_per_second)
        position_ids[:, row, valid] = positions.to(position_ids.device, position_ids.dtype)
        deltas.append(int(positions.max()) + 1 - len(types))
    return position_ids, torch.tensor(deltas, device=input_ids.device).unsqueeze(1)


ORIGINAL: dict[type, Any] = {}
"""The replaced methods, kept for tests that show where transformers' own positions differ."""


def apply() -> None:
    """Install :func:`rope_index` on the Qwen2-VL and Qwen2.5-VL models (idempotent)."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    for cls in (Qwen2VLModel, Qwen2_5_VLModel):
        if cls.get_rope_index is not rope_index:
            ORIGINAL[cls] = cls.get_rope_index
            cls.get_rope_index = rope_index
