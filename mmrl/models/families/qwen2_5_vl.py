"""Qwen2.5-VL: Qwen2-VL's layout (:mod:`mmrl.models.families.qwen2_vl`) with a windowed vision tower (full
attention in a few blocks), an RMSNorm/SwiGLU tower and video time positions scaled by the seconds one
temporal grid step spans (``second_per_grid_ts`` x ``tokens_per_second``)."""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
)

from mmrl.config import TinyModelConfig
from mmrl.models.families.qwen2_vl import CHAT_TEMPLATE, Qwen2VL, text_config, token_ids


class Qwen2_5VL(Qwen2VL):
    name = "qwen2_5_vl"
    model_type = "qwen2_5_vl"
    processor_class = "Qwen2_5_VLProcessor"

    def build_processor(self, tokenizer: PreTrainedTokenizerFast, spec: TinyModelConfig) -> Any:
        size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
        shared = dict(size=size, patch_size=self.patch_size(spec), merge_size=spec.merge_size, temporal_patch_size=2)
        return Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(**shared),
                                   video_processor=Qwen2VLVideoProcessor(**shared), tokenizer=tokenizer,
                                   chat_template=CHAT_TEMPLATE)

    def build_config(self, tokenizer: PreTrainedTokenizerFast, spec: TinyModelConfig) -> Any:
        patch = self.patch_size(spec)
        vision = dict(depth=spec.vision_depth, hidden_size=spec.vision_hidden_size,
                      intermediate_size=spec.vision_hidden_size * 2, num_heads=spec.vision_heads, patch_size=patch,
                      spatial_merge_size=spec.merge_size, out_hidden_size=spec.hidden_size,
                      window_size=patch * spec.merge_size * 4, fullatt_block_indexes=[spec.vision_depth - 1])
        return Qwen2_5_VLConfig(text_config=text_config(tokenizer, spec), vision_config=vision,
                                tie_word_embeddings=False, **token_ids(tokenizer))

    def model_class(self) -> type[nn.Module]:
        return Qwen2_5_VLForConditionalGeneration


QWEN2_5_VL = Qwen2_5VL()
