"""Qwen2-VL: a ViT over 14-pixel patches merged 2 x 2, 3-D (mrope) positions, images and videos.

What the family has that others do not:

- **placeholders**: ``<|vision_start|><|image_pad|><|vision_end|>`` per image, the pad expanded by the
  processor to one token per merged patch (t*h*w/4); videos likewise with ``<|video_pad|>``;
- **media**: pixels flattened to patches, (patches, C*T*P*P), and a (t, h, w) patch grid per item; the tower
  (``model.visual``) runs on all items of a batch at once;
- **positions**: (3, B, L): text advances the three axes together, a media item spreads its tokens over
  (time, row, column) and the next token follows its largest position (:mod:`mmrl.patches.qwen_mrope`,
  which also serves Qwen2.5-VL).

Qwen2.5-VL (:mod:`mmrl.models.families.qwen2_5_vl`) and Qwen3-VL (:mod:`mmrl.models.families.qwen3_vl`)
derive from this adapter and override what they change.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
)
from transformers.modeling_outputs import BaseModelOutputWithPooling

from mmrl.config import TinyModelConfig
from mmrl.models.families.base import Family
from mmrl.models.families.groups import ModelGroups
from mmrl.models.media import frames_array, present_media, video_metadata
from mmrl.models.tokenizer import train_tokenizer
from mmrl.models.tool_calls import QWEN_TOOL_CALLS

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")

# Qwen's chat layout; content is a string or a list of {"type": "image" | "video" | "text"} items.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE over ``texts`` with Qwen's special tokens and chat layout."""
    return train_tokenizer(texts, vocab_size, SPECIAL_TOKENS, eos="<|im_end|>", pad="<|endoftext|>",
                           chat_template=CHAT_TEMPLATE)


def token_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    """The config's special token ids, matching ``tokenizer``."""
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
    return {"image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"]}


def mrope_section(spec: TinyModelConfig) -> list[int]:
    """Rotary frequencies per axis (t, h, w), summing to head_dim / 2 (the default [16, 24, 24] fits only
    head_dim 128): a quarter to time, the rest split between height and width."""
    half = spec.hidden_size // spec.num_heads // 2
    temporal = half // 4
    spatial = (half - temporal) // 2
    return [temporal, spatial, half - temporal - spatial]


def text_config(tokenizer: PreTrainedTokenizerFast, spec: TinyModelConfig, **extra: Any) -> dict[str, Any]:
    """The language model's config of a tiny Qwen-VL (mrope over :func:`mrope_section`)."""
    return dict(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope_section(spec)},
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"), eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **extra,
    )


class Qwen2VL(Family):
    name = "qwen2_vl"
    model_type = "qwen2_vl"
    processor_class = "Qwen2VLProcessor"
    position_axes = 3
    takes_video = True
    engine_media_kinds = ("image", "video")
    media_sizing = "qwen"  # and the subclasses, Qwen2.5-VL and Qwen3-VL
    default_patch_size = 14
    # Also Qwen2.5-VL's and Qwen3-VL's: the merger (and Qwen3-VL's deepstack mergers) sit inside the tower.
    groups = ModelGroups(vision="visual", vision_blocks="visual.blocks", projector="visual.merger",
                         llm="language_model", decoder_layers="language_model.layers")
    # Qwen's own format, which the Qwen templates with tool support write (Qwen2-VL's and Qwen2.5-VL's published
    # templates have none: mmrl writes the same text for them, mmrl.agent.chat).
    tool_calls = QWEN_TOOL_CALLS

    # ---- checkpoints ---------------------------------------------------------------------------

    def prepare(self) -> None:
        from mmrl.patches import patch_embed, qwen_mrope

        qwen_mrope.apply()
        patch_embed.apply()

    def patch_size(self, spec: TinyModelConfig) -> int:
        return spec.patch_size or self.default_patch_size

    def build_processor(self, tokenizer: PreTrainedTokenizerFast, spec: TinyModelConfig) -> Any:
        """Image and video processors sized for the spec, joined with the tokenizer."""
        size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
        shared = dict(size=size, patch_size=self.patch_size(spec), merge_size=spec.merge_size, temporal_patch_size=2)
        return Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**shared),
                                video_processor=Qwen2VLVideoProcessor(**shared), tokenizer=tokenizer,
                                chat_template=CHAT_TEMPLATE)

    def build_config(self, tokenizer: PreTrainedTokenizerFast, spec: TinyModelConfig) -> Any:
        vision = dict(depth=spec.vision_depth, embed_dim=spec.vision_hidden_size, hidden_size=spec.hidden_size,
                      mlp_ratio=2, num_heads=spec.vision_heads, patch_size=self.patch_size(spec),
                      spatial_merge_size=spec.merge_size)
        return Qwen2VLConfig(text_config=text_config(tokenizer, spec), vision_config=vision,
                             tie_word_embeddings=False, **token_ids(tokenizer))

    def model_class(self) -> type[nn.Module]:
        return Qwen2VLForConditionalGeneration

    def build_tiny(self, texts: Iterable[str], spec: TinyModelConfig, seed: int) -> tuple[nn.Module, Any]:
        tokenizer = qwen_tokenizer(texts, spec.vocab_size)
        processor = self.build_processor(tokenizer, spec)
        torch.manual_seed(seed)
        return self.model_class()(self.build_config(tokenizer, spec)), processor

    # ---- encoding ------------------------------------------------------------------------------

    def encode(self, processor: Any, text: str, images: Sequence[Any], videos: Sequence[Any]) -> dict[str, Any]:
        video_kwargs: dict[str, Any] = {}
        if videos:
            # Frames were sampled and sized by data prep: the processor must neither resample nor re-budget them.
            video_kwargs = {"videos": [frames_array(v) for v in videos],
                            "video_metadata": [video_metadata(v) for v in videos],
                            "do_sample_frames": False, **self.video_kwargs()}
        out = processor(text=[text], images=list(images) or None, return_tensors="pt", return_mm_token_type_ids=True,
                        **video_kwargs)
        seconds = out.get("second_per_grid_ts")
        return dict(
            input_ids=out["input_ids"][0], mm_token_type_ids=out["mm_token_type_ids"][0],
            pixel_values=out.get("pixel_values"), image_grid_thw=out.get("image_grid_thw"),
            pixel_values_videos=out.get("pixel_values_videos"), video_grid_thw=out.get("video_grid_thw"),
            second_per_grid_ts=torch.as_tensor(seconds, dtype=torch.float32) if seconds is not None else None,
        )

    def encode_many(self, processor: Any, texts: Sequence[str], images: Sequence[Sequence[Any]],
                    videos: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
        """The prompts without a video in one processor call (whose fixed cost, about 1 ms on CPU, dominates a
        small prompt's encoding), split back per prompt; a prompt with a video alone, as :meth:`encode`."""
        plain = [i for i, v in enumerate(videos) if not v]
        together = dict(zip(plain, self._encode_image_prompts(processor, [texts[i] for i in plain],
                                                               [images[i] for i in plain])))
        return [together[i] if i in together else self.encode(processor, texts[i], images[i], videos[i])
                for i in range(len(texts))]

    def _encode_image_prompts(self, processor: Any, texts: list[str], images: list[Sequence[Any]]
                              ) -> list[dict[str, Any]]:
        if not texts:
            return []
        flat = [image for row in images for image in row]
        batch = processor(text=texts, images=flat or None, padding=True, return_tensors="pt",
                          return_mm_token_type_ids=True)
        grids = batch.get("image_grid_thw")
        # Copies, not views: a view would carry (and pickle) the whole batch's storage with each prompt.
        pixels = [p.clone() for p in batch["pixel_values"].split(grids.prod(-1).tolist())] if flat else []
        encoded, first = [], 0
        for row, row_images in enumerate(images):
            real = batch["attention_mask"][row].bool()
            last = first + len(row_images)
            encoded.append(dict(
                input_ids=batch["input_ids"][row][real], mm_token_type_ids=batch["mm_token_type_ids"][row][real],
                pixel_values=torch.cat(pixels[first:last]) if row_images else None,
                image_grid_thw=grids[first:last].clone() if row_images else None,
                pixel_values_videos=None, video_grid_thw=None, second_per_grid_ts=None))
            first = last
        return encoded

    def video_kwargs(self) -> dict[str, Any]:
        """Extra processor arguments for pre-sampled frames: data prep budgeted their pixels already, so the
        processor's own per-frame cap stays off."""
        return {"cap_pixels_per_frame": False}

    def vision_tokens(self, tokenizer: PreTrainedTokenizerFast) -> list[str]:
        return list(VISION_TOKENS)

    def grid_pixels(self, processor: Any) -> int:
        return int(processor.image_processor.patch_size)

    def size_factor(self, processor: Any) -> int:
        image = processor.image_processor
        return int(image.patch_size) * int(image.merge_size)

    # ---- positions -----------------------------------------------------------------------------

    GRID_KEYS = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")

    def positions(self, core: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model's own ``get_rope_index`` (patched for Qwen2/2.5-VL: :mod:`mmrl.patches.qwen_mrope`)."""
        grids = {k: inputs[k] for k in self.GRID_KEYS if k in inputs}
        positions, _ = core.get_rope_index(inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                                           attention_mask=inputs["attention_mask"], **grids)
        return positions

    def prompt_positions(self, core: nn.Module, prompt: Any) -> torch.Tensor:
        grids = {k: getattr(prompt, k) for k in self.GRID_KEYS if getattr(prompt, k) is not None}
        if not any(k.endswith("grid_thw") for k in grids):  # text only: 1-D positions on all three axes
            return torch.arange(len(prompt)).expand(3, -1)
        positions, _ = core.get_rope_index(prompt.input_ids[None], mm_token_type_ids=prompt.mm_token_type_ids[None],
                                           **grids)
        return positions[:, 0]

    # ---- vision --------------------------------------------------------------------------------

    def dummy_media(self, visual: nn.Module, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The smallest input the tower accepts: one (1, m, m) grid, m = spatial merge size -> one token.

        Returns pixels (m*m, C*T*P*P) of zeros and grid_thw (1, 3).
        """
        cfg = visual.config
        merge = cfg.spatial_merge_size
        width = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
        pixels = torch.zeros(merge * merge, width, device=device, dtype=dtype)
        return pixels, torch.tensor([[1, merge, merge]], device=device)

    def encode_media(self, core: nn.Module, inputs: dict[str, torch.Tensor],
                     always: bool) -> tuple[dict[str, Any], torch.Tensor | None]:
        """The tower on the concatenated image and video patches; per item, its merged tokens (tokens_i, D)."""
        visual = core.visual
        dtype = next(visual.parameters()).dtype
        present = present_media(inputs)
        if not present:
            if not always:
                return {}, None
            pixels, grid = self.dummy_media(visual, inputs["input_ids"].device, dtype)
            return {}, self.anchor(visual(pixels, grid_thw=grid))
        pixels = torch.cat([p for _, p, _, _ in present]).to(dtype)
        grids = torch.cat([g for _, _, g, _ in present])
        out = visual(pixels, grid_thw=grids)
        sizes = (grids.prod(-1) // visual.config.spatial_merge_size**2).tolist()
        features = self.split_features(out, sizes)
        outputs, start = {}, 0
        for kind, _, grid, index in present:
            count = grid.shape[0]
            order = list(range(start, start + count))
            if index is not None:  # shared media: the batch's items are copies of the distinct ones
                order = [order[i] for i in index.tolist()]
            outputs[kind] = self.output_of(features, order)
            start += count
        return outputs, None

    def split_features(self, out: Any, sizes: list[int]) -> dict[str, Any]:
        """The tower's output -> per-item pieces of each feature it gives the language model."""
        return {"pooler_output": torch.split(out.pooler_output, sizes)}

    def output_of(self, features: dict[str, Any], order: list[int]) -> BaseModelOutputWithPooling:
        """The encoder output of the items ``order`` (indices into the split features), as the model takes it."""
        return BaseModelOutputWithPooling(pooler_output=tuple(features["pooler_output"][i] for i in order))

    def anchor(self, out: Any) -> torch.Tensor:
        """A zero scalar that depends on every output of the tower (a dummy pass stays in the graph)."""
        return out.pooler_output.sum() * 0.0


QWEN2_VL = Qwen2VL()
