"""The vision tower's forward FLOPs from the model's config and the images' patch grids.

Counted as torch's ``FlopCounterMode`` counts them: only matrix products, 2 * m * n * k each; a convolution as
its matrix-product equivalent (its bias not counted); attention as its two products, the scores (q @ k^T) and
the weighted sum (weights @ v), over the (query, key) pairs of each attention segment. Norms, activations, the
rotary embedding and a learned position table's lookup and resampling (Qwen3-VL's bilinear weights are an
elementwise product and a sum) are not matrix products and count nothing. Checked against a counted forward of
each family's tiny model in ``tests/unit/test_vision_flops.py``.

What each family's tower runs, as transformers implements it:

- **Qwen2-VL** (``qwen2_vl``): a Conv3d patch embedding whose kernel is the whole patch (one product per
  patch: C*T*P*P -> D; the project's linear form of it, :mod:`mmrl.patches.patch_embed`, counts the same),
  ``depth`` blocks of qkv, attention within each *frame* (a (t, h, w) item is t segments of h*w patches), proj
  and an fc1/fc2 MLP of width ``D * mlp_ratio``; the merger's two linears on the units of
  ``spatial_merge_size**2`` patches (m*m*D -> m*m*D -> the LLM's width).
- **Qwen2.5-VL** (``qwen2_5_vl``): the same, with a gated MLP (gate, up, down) and windowed attention in the
  blocks not in ``fullatt_block_indexes``: each frame's merged units are cut into windows of
  ``window_size // spatial_merge_size // patch_size`` units a side from its top-left corner, the last row and
  column of windows holding the remainder.
- **Qwen3-VL** (``qwen3_vl``): Qwen2-VL's attention (per frame) and an fc1/fc2 MLP (``intermediate_size``), a
  Conv3d embedding, the merger, and one more merger per block in ``deepstack_visual_indexes``.
- **SmolVLM / Idefics3** (``smolvlm``, ``idefics3``): a SigLIP tower on fixed ``image_size`` square tiles
  (Conv2d patch embedding, q/k/v/out projections, full attention over the tile's patches, fc1/fc2 MLP) and
  the connector: a pixel shuffle by ``scale_factor`` (no product) and one linear to the LLM's width.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from mmrl.models.media import present_media

Grid = tuple[int, int, int]


def _linear(rows: int, fan_in: int, fan_out: int) -> int:
    """A (rows, fan_in) @ (fan_in, fan_out) product."""
    return 2 * rows * fan_in * fan_out


def _attention(pairs: int, width: int) -> int:
    """Scores and weighted sum over ``pairs`` (query, key) pairs, all heads together ``width`` wide."""
    return 4 * pairs * width


def _frame_pairs(grid: Grid) -> int:
    """(query, key) pairs of attention within each frame of a (t, h, w) item."""
    t, h, w = grid
    return t * (h * w) ** 2


def _window_sides(units: int, window: int) -> list[int]:
    """The sides, in merged units, of the windows that cut ``units`` from the start: full ones, the rest."""
    return [window] * (units // window) + ([units % window] if units % window else [])


def _window_pairs(grid: Grid, merge: int, window: int) -> int:
    """(query, key) pairs of attention within each window of each frame (Qwen2.5-VL's windowed blocks)."""
    t, h, w = grid
    rows = sum(side**2 for side in _window_sides(h // merge, window))
    cols = sum(side**2 for side in _window_sides(w // merge, window))
    return t * rows * cols * merge**4  # a window of r x c units holds r*c*merge^2 patches


def _merger(units: int, context: int, merge: int, out: int) -> int:
    """A Qwen patch merger on ``units`` merged units: m*m*context -> m*m*context -> ``out``."""
    width = context * merge**2
    return _linear(units, width, width) + _linear(units, width, out)


def _patch_in(vision: Any) -> int:
    """Numbers per flattened Qwen patch: C * T * P * P."""
    return vision.in_channels * vision.temporal_patch_size * vision.patch_size**2


def qwen2_vl_flops(config: Any, grid: Grid) -> int:
    """Qwen2-VL's tower on one (t, h, w) item (see the module's docstring)."""
    vision = config.vision_config
    dim, merge = vision.embed_dim, vision.spatial_merge_size
    patches = grid[0] * grid[1] * grid[2]
    mlp = int(dim * vision.mlp_ratio)
    block = _linear(patches, dim, 3 * dim) + _linear(patches, dim, dim) + 2 * _linear(patches, dim, mlp)
    block += _attention(_frame_pairs(grid), dim)
    # Qwen2-VL's vision ``hidden_size`` is the LLM's width, the merger's output.
    merger = _merger(patches // merge**2, dim, merge, vision.hidden_size)
    return _linear(patches, _patch_in(vision), dim) + vision.depth * block + merger


def qwen2_5_vl_flops(config: Any, grid: Grid) -> int:
    """Qwen2.5-VL's tower on one (t, h, w) item: windowed blocks, full ones, gated MLP."""
    vision = config.vision_config
    dim, merge = vision.hidden_size, vision.spatial_merge_size
    patches = grid[0] * grid[1] * grid[2]
    dense = (_linear(patches, dim, 3 * dim) + _linear(patches, dim, dim)
             + 3 * _linear(patches, dim, vision.intermediate_size))
    full = sum(1 for i in range(vision.depth) if i in vision.fullatt_block_indexes)
    window = vision.window_size // merge // vision.patch_size
    attention = (full * _attention(_frame_pairs(grid), dim)
                 + (vision.depth - full) * _attention(_window_pairs(grid, merge, window), dim))
    merger = _merger(patches // merge**2, dim, merge, vision.out_hidden_size)
    return _linear(patches, _patch_in(vision), dim) + vision.depth * dense + attention + merger


def qwen3_vl_flops(config: Any, grid: Grid) -> int:
    """Qwen3-VL's tower on one (t, h, w) item: the blocks, the merger and the deepstack mergers."""
    vision = config.vision_config
    dim, merge = vision.hidden_size, vision.spatial_merge_size
    patches = grid[0] * grid[1] * grid[2]
    block = (_linear(patches, dim, 3 * dim) + _linear(patches, dim, dim)
             + 2 * _linear(patches, dim, vision.intermediate_size) + _attention(_frame_pairs(grid), dim))
    # A deepstack merger runs after each listed block that exists, once however often it is listed.
    deepstack = len({i for i in vision.deepstack_visual_indexes if 0 <= i < vision.depth})
    mergers = (1 + deepstack) * _merger(patches // merge**2, dim, merge, vision.out_hidden_size)
    return _linear(patches, _patch_in(vision), dim) + vision.depth * block + mergers


def tile_patches(config: Any) -> int:
    """Patches of one SmolVLM / Idefics3 tile: (image_size // patch_size) ** 2."""
    vision = config.vision_config
    return (vision.image_size // vision.patch_size) ** 2


def smolvlm_flops(config: Any, grid: Grid) -> int:
    """SmolVLM's (or Idefics3's) tower and connector on one item of ``t`` tiles.

    The tower takes fixed ``image_size`` square tiles, so only the tile count t matters; (h, w) must be a
    tile's token grid (the project's ``image_grid_thw``: image_seq_len = h * w tokens) or its patch grid
    (image_size // patch_size a side), else ValueError.
    """
    vision, scale = config.vision_config, config.scale_factor
    tiles, h, w = grid
    patches = tile_patches(config)
    if h * w not in (patches, patches // scale**2):
        raise ValueError(f"SmolVLM grid {grid}: a tile is {patches} patches, {patches // scale**2} tokens; "
                         "(h, w) must be its patch grid or its token grid")
    dim, rows = vision.hidden_size, tiles * patches
    block = 4 * _linear(rows, dim, dim) + 2 * _linear(rows, dim, vision.intermediate_size)
    block += _attention(tiles * patches**2, dim)
    embed = _linear(rows, vision.num_channels * vision.patch_size**2, dim)
    connector = _linear(rows // scale**2, dim * scale**2, config.text_config.hidden_size)
    return embed + vision.num_hidden_layers * block + connector


FAMILY_FLOPS: dict[str, Callable[[Any, Grid], int]] = {
    "qwen2_vl": qwen2_vl_flops,
    "qwen2_5_vl": qwen2_5_vl_flops,
    "qwen3_vl": qwen3_vl_flops,
    "smolvlm": smolvlm_flops,
    "idefics3": smolvlm_flops,
}
"""Each counted family's tower FLOPs of one item, by ``config.model_type``."""

TILED = ("smolvlm", "idefics3")


def _family_flops(config: object) -> Callable[[Any, Grid], int]:
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILY_FLOPS:
        raise NotImplementedError(f"no vision FLOP count for model_type {model_type!r}; counted: "
                                  f"{', '.join(FAMILY_FLOPS)}")
    return FAMILY_FLOPS[model_type]


def vision_flops(config: object, grids: Sequence[tuple[int, int, int]]) -> int:
    """Forward FLOPs of the vision tower (patch embedding, blocks, merger / connector: everything the family's
    encoder runs to produce the tokens the LLM reads) for items whose grids are ``grids``, (t, h, w) each.

    ``config`` is the ``*ForConditionalGeneration`` model's config (``model_type`` picks the family;
    NotImplementedError for another). Qwen: t, h, w in the tower's input patches (``image_grid_thw`` /
    ``video_grid_thw`` rows). SmolVLM / Idefics3: t tiles of the tower's square size, (h, w) a tile's token
    grid (the ``image_grid_thw`` rows of :mod:`mmrl.models.families.smolvlm`) or its patch grid. Attention
    never crosses an item, so the count is a sum over ``grids``; :func:`vision_grids` reads them from a batch.
    """
    per_grid = _family_flops(config)
    return sum(per_grid(config, (int(t), int(h), int(w))) for t, h, w in grids)


def vision_grids(inputs: Mapping[str, torch.Tensor], config: object) -> list[tuple[int, int, int]]:
    """The grids of the items the vision tower runs on for collated ``inputs``
    (:func:`mmrl.models.encoding.collate`): the images', then the videos' ``image_grid_thw`` /
    ``video_grid_thw`` rows, for the kinds whose pixels are present; with shared media the distinct items'
    grids (the tower runs each once). No media: [] (a dummy pass of an always-run tower is not counted).

    SmolVLM / Idefics3 inputs without grids (a processor's own (B, N, C, H, W) ``pixel_values``): a
    (1, H/P, W/P) grid per tile that is not all zeros, as the model drops zero padding tiles (keeping one if
    all are).
    """
    _family_flops(config)
    if getattr(config, "model_type", None) in TILED and "image_grid_thw" not in inputs:
        return _tile_grids(inputs.get("pixel_values"), config)
    present = present_media(dict(inputs))
    return [(int(t), int(h), int(w)) for _, _, grids, _ in present for t, h, w in grids.tolist()]


def _tile_grids(pixels: torch.Tensor | None, config: Any) -> list[tuple[int, int, int]]:
    """Pixel tiles (..., C, H, W) -> a (1, H/P, W/P) patch grid per real (not all-zero) tile."""
    if pixels is None:
        return []
    tiles = pixels.reshape(-1, *pixels.shape[-3:])
    real = int(tiles.flatten(1).ne(0).any(-1).sum())
    patch = config.vision_config.patch_size
    grid = (1, pixels.shape[-2] // patch, pixels.shape[-1] // patch)
    return [grid] * max(real, min(1, tiles.shape[0]))
