"""The analytic vision-tower FLOPs (:mod:`mmrl.perf.vision`) equal what torch's FlopCounterMode counts in each
family's tiny tower, run through the project's vision pass on real encoded images."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

from mmrl.config import TinyModelConfig
from mmrl.models.encoding import EncodedPrompt, collate, encode_prompt
from mmrl.models.families import FAMILIES, family_of
from mmrl.models.loading import load_model, load_processor
from mmrl.models.tiny import build_tiny_vlm
from mmrl.perf.vision import vision_flops, vision_grids

TEXTS = ["What colour is the square? It is red.", "How many dots are there? There are three."] * 8
# Images up to 224 x 224: Qwen2.5-VL's windows are 4 merged units (112 px) a side, so a 196 x 140 image has
# edge windows; SmolVLM's tile is 224 px, 16 x 16 patches, 8 x 8 tokens. The LLM (64) is wider than the tower
# (32), so a merger's output width is pinned.
SPEC = TinyModelConfig(vocab_size=128, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=64, vision_depth=2, vision_hidden_size=32, vision_heads=2,
                       max_pixels=224 * 224)

Model = tuple[Any, Any]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Model]:
    """Each family's tiny model (eager attention: its products are counted) and its processor."""
    out = {}
    for name in FAMILIES:
        path = build_tiny_vlm(TEXTS, SPEC, Path(tmp_path_factory.mktemp(f"vision-{name}")), family=name)
        out[name] = load_model(path, "float32", "eager", torch.device("cpu")).eval(), load_processor(path)
    return out


def image_prompt(processor: Any, sizes: list[tuple[int, int]]) -> EncodedPrompt:
    """A prompt with one plain image per (width, height) of ``sizes``."""
    images = [Image.new("RGB", size, (40 * i, 200, 30)) for i, size in enumerate(sizes)]
    messages = [{"role": "user", "content": "<image>" * len(sizes) + "What colour?"}]
    return encode_prompt(processor, messages, images)


def add_video(inputs: dict[str, torch.Tensor], model: Any, grid: tuple[int, int, int]) -> None:
    """Random flattened video patches of ``grid`` (t, h, w), as Qwen's video processor lays them out."""
    vision = model.config.vision_config
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    inputs["pixel_values_videos"] = torch.randn(grid[0] * grid[1] * grid[2], width)
    inputs["video_grid_thw"] = torch.tensor([grid])


def counted(model: Any, inputs: dict[str, torch.Tensor]) -> int:
    """FLOPs that FlopCounterMode counts in the project's vision pass (tower and merger / connector)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        outputs, anchor = family_of(model.config).encode_media(model.model, inputs, always=False)
    assert outputs and anchor is None
    return counter.get_total_flops()


# Per family: the images' (width, height), a video grid for the Qwens (t = 2: attention per frame), the grids.
CASES = {
    "qwen2_vl": ([(84, 56), (196, 140)], (2, 4, 6), [(1, 4, 6), (1, 10, 14), (2, 4, 6)]),
    "qwen2_5_vl": ([(196, 140), (56, 56)], (2, 6, 10), [(1, 10, 14), (1, 4, 4), (2, 6, 10)]),
    "qwen3_vl": ([(64, 64), (192, 128)], (2, 4, 6), [(1, 4, 4), (1, 8, 12), (2, 4, 6)]),
    "smolvlm": ([(112, 112), (56, 56)], None, [(1, 8, 8), (1, 8, 8)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_counted_tower_flops(tiny: dict[str, Model], name: str) -> None:
    model, processor = tiny[name]
    sizes, video, expected = CASES[name]
    inputs = collate([image_prompt(processor, sizes)], processor.tokenizer.pad_token_id)
    if video is not None:
        add_video(inputs, model, video)
    grids = vision_grids(inputs, model.config)
    assert grids == expected
    assert counted(model, inputs) == vision_flops(model.config, grids)


def test_qwen2_5_case_has_edge_windows(tiny: dict[str, Model]) -> None:
    """The Qwen2.5-VL case pins the windows: its grids do not divide into whole windows, and its windowed
    blocks attend to fewer pairs than full ones would."""
    model, _ = tiny["qwen2_5_vl"]
    vision = model.config.vision_config
    assert 0 < len(vision.fullatt_block_indexes) < vision.depth
    units = vision.window_size // vision.spatial_merge_size // vision.patch_size
    grids = CASES["qwen2_5_vl"][2]
    assert any((h // vision.spatial_merge_size) % units for _, h, _ in grids)
    assert any((w // vision.spatial_merge_size) % units for _, _, w in grids)
    full = copy.deepcopy(model.config)
    full.vision_config.fullatt_block_indexes = list(range(vision.depth))
    assert vision_flops(full, grids) > vision_flops(model.config, grids)


def test_shared_media_counts_each_distinct_item_once(tiny: dict[str, Model]) -> None:
    model, processor = tiny["qwen2_vl"]
    first, second = image_prompt(processor, [(84, 56)]), image_prompt(processor, [(56, 112), (112, 56)])
    inputs = collate([first, first, second, first], processor.tokenizer.pad_token_id, share_media=True)
    grids = vision_grids(inputs, model.config)
    assert grids == [(1, 4, 6), (1, 8, 4), (1, 4, 8)]
    assert counted(model, inputs) == vision_flops(model.config, grids)


def test_smolvlm_tiles(tiny: dict[str, Model]) -> None:
    """An item of several tiles (a video's frames) and a single tile, as the project's grids give them."""
    model, _ = tiny["smolvlm"]
    side = model.config.vision_config.image_size
    inputs = {"input_ids": torch.zeros(1, 1, dtype=torch.long), "pixel_values": torch.randn(3, 3, side, side),
              "image_grid_thw": torch.tensor([[2, 8, 8], [1, 8, 8]])}
    grids = vision_grids(inputs, model.config)
    assert grids == [(2, 8, 8), (1, 8, 8)]
    assert counted(model, inputs) == vision_flops(model.config, grids)
    assert vision_flops(model.config, [(3, 16, 16)]) == vision_flops(model.config, grids)  # patch grids too
    with pytest.raises(ValueError, match="tile"):
        vision_flops(model.config, [(1, 8, 16)])


def test_smolvlm_processor_pixels_skip_padding_tiles(tiny: dict[str, Model]) -> None:
    """A processor's (B, N, C, S, S) pixels: the model drops all-zero padding tiles, and so do the grids."""
    model, _ = tiny["smolvlm"]
    side = model.config.vision_config.image_size
    pixels = torch.randn(2, 2, 3, side, side)
    pixels[1, 1] = 0.0
    grids = vision_grids({"pixel_values": pixels}, model.config)
    assert grids == [(1, 16, 16)] * 3
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.model.get_image_features(pixel_values=pixels)
    assert counter.get_total_flops() == vision_flops(model.config, grids)


def test_text_only_inputs_have_no_grids(tiny: dict[str, Model]) -> None:
    model, processor = tiny["qwen3_vl"]
    inputs = collate([image_prompt(processor, [])], processor.tokenizer.pad_token_id)
    assert vision_grids(inputs, model.config) == []
    assert vision_flops(model.config, []) == 0


def test_unknown_family_raises() -> None:
    config = SimpleNamespace(model_type="llava", vision_config=SimpleNamespace())
    with pytest.raises(NotImplementedError, match="llava"):
        vision_flops(config, [(1, 4, 4)])
    with pytest.raises(NotImplementedError, match="llava"):
        vision_grids({"pixel_values": torch.zeros(16, 3), "image_grid_thw": torch.ones(1, 3)}, config)
