"""Build a tiny Qwen2.5-VL from scratch: random weights, a BPE tokenizer trained on a task corpus.

The result is saved in Hugging Face format and is loaded back like any checkpoint, through the Auto
classes (``mmrl.models.loading``), so nothing downstream knows it is tiny.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
)

from mmrl.config import TinyModelConfig

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

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


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE over ``texts`` with the Qwen special tokens and chat template."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_processor(tokenizer: PreTrainedTokenizerFast, spec: TinyModelConfig) -> Qwen2_5_VLProcessor:
    """Image and video processors sized for the spec, joined with the tokenizer."""
    size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
    shared = dict(size=size, patch_size=spec.patch_size, merge_size=spec.merge_size, temporal_patch_size=2)
    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**shared),
        video_processor=Qwen2VLVideoProcessor(**shared),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )


def build_model_config(tokenizer: PreTrainedTokenizerFast, spec: TinyModelConfig) -> Qwen2_5_VLConfig:
    """A Qwen2.5-VL config whose special token ids match ``tokenizer``."""
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": spec.mrope_section},
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    vision = dict(
        depth=spec.vision_depth,
        hidden_size=spec.vision_hidden_size,
        intermediate_size=spec.vision_hidden_size * 2,
        num_heads=spec.vision_heads,
        patch_size=spec.patch_size,
        spatial_merge_size=spec.merge_size,
        out_hidden_size=spec.hidden_size,
        window_size=spec.patch_size * spec.merge_size * 4,
        fullatt_block_indexes=[spec.vision_depth - 1],
    )
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def build_tiny_vlm(texts: Iterable[str], spec: TinyModelConfig, out_dir: str | Path, seed: int = 0) -> Path:
    """Train the tokenizer on ``texts``, initialise the model at random, save both to ``out_dir``."""
    out = Path(out_dir)
    tokenizer = train_tokenizer(texts, spec.vocab_size)
    processor = build_processor(tokenizer, spec)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(build_model_config(tokenizer, spec))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
