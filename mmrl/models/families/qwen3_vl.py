"""Qwen3-VL: Qwen's placeholders and 3-D positions (:mod:`mmrl.models.families.qwen2_vl`), changed where
Qwen3-VL changed them:

- **vision tower**: 16-pixel patches, a learned position embedding resampled to each image's grid, and
  *deepstack* features: the outputs of a few early tower blocks, merged like the final output, that the
  language model adds to the hidden states at the vision positions after its first decoder layers. The
  tower's encoder output therefore carries ``deepstack_features`` beside ``pooler_output``, and a dummy
  pass anchors both;
- **positions**: the three axes are interleaved over the rotary frequencies (``mrope_section`` still gives
  their shares), and the model's own ``get_rope_index`` is used (it already continues after a media item at
  its largest position + 1);
- **video**: each temporal grid step is its own ``<|vision_start|>...<|vision_end|>`` block preceded by its
  timestamp as text (``<1.0 seconds>``), so a frame's time is told by text, not by the time axis (each frame
  has time extent 1); the processor writes the timestamps from the frames' metadata.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLImageProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)
from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

from mmrl.config import TinyModelConfig
from mmrl.models.families.qwen2_vl import CHAT_TEMPLATE, Qwen2VL, text_config, token_ids


def interleaved_section(half: int) -> list[int]:
    """Rotary frequencies per axis (t, h, w) for ``half`` = head_dim / 2 frequencies taken in turn t, h, w, ...:
    h and w get ``half // 3`` each (every third frequency up to 3 x their share), t the rest (as [24, 20, 20]
    of the released 64)."""
    share = half // 3
    return [half - 2 * share, share, share]


class Qwen3VL(Qwen2VL):
    name = "qwen3_vl"
    model_type = "qwen3_vl"
    processor_class = "Qwen3VLProcessor"
    default_patch_size = 16
    GRID_KEYS = ("image_grid_thw", "video_grid_thw")

    def prepare(self) -> None:
        """Nothing to patch: transformers' Qwen3-VL positions are the released model's."""

    def build_processor(self, tokenizer: PreTrainedTokenizerFast, spec: TinyModelConfig) -> Any:
        size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
        # Qwen3-VL normalises images and videos alike, to [-1, 1] (Qwen2-VL's image processor defaults to CLIP's).
        shared = dict(size=size, patch_size=self.patch_size(spec), merge_size=spec.merge_size, temporal_patch_size=2,
                      image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
        return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**shared),
                                video_processor=Qwen3VLVideoProcessor(**shared), tokenizer=tokenizer,
                                chat_template=CHAT_TEMPLATE)

    def build_config(self, tokenizer: PreTrainedTokenizerFast, spec: TinyModelConfig) -> Any:
        patch = self.patch_size(spec)
        side = max(1, int(spec.max_pixels**0.5) // patch)  # the learned position grid covers the largest image
        text = text_config(tokenizer, spec, head_dim=spec.hidden_size // spec.num_heads)
        # As released: transformers always interleaves the axes; vLLM does where the config says so.
        text["rope_parameters"].update(mrope_section=interleaved_section(spec.hidden_size // spec.num_heads // 2),
                                       mrope_interleaved=True)
        vision = dict(depth=spec.vision_depth, hidden_size=spec.vision_hidden_size,
                      intermediate_size=spec.vision_hidden_size * 2, num_heads=spec.vision_heads, patch_size=patch,
                      spatial_merge_size=spec.merge_size, temporal_patch_size=2, out_hidden_size=spec.hidden_size,
                      num_position_embeddings=side * side, deepstack_visual_indexes=[0])
        return Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **token_ids(tokenizer))

    def model_class(self) -> type[nn.Module]:
        return Qwen3VLForConditionalGeneration

    # ---- vision --------------------------------------------------------------------------------

    def split_features(self, out: Any, sizes: list[int]) -> dict[str, Any]:
        return {"pooler_output": torch.split(out.pooler_output, sizes),
                "deepstack": [torch.split(level, sizes) for level in out.deepstack_features]}

    def output_of(self, features: dict[str, Any], order: list[int]) -> BaseModelOutputWithDeepstackFeatures:
        return BaseModelOutputWithDeepstackFeatures(
            pooler_output=tuple(features["pooler_output"][i] for i in order),
            deepstack_features=[tuple(level[i] for i in order) for level in features["deepstack"]],
        )

    def anchor(self, out: Any) -> torch.Tensor:
        return sum((level.sum() for level in out.deepstack_features), out.pooler_output.sum()) * 0.0


QWEN3_VL = Qwen3VL()
