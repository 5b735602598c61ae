"""Build a tiny VLM of any family from scratch: random weights, a BPE tokenizer trained on a task corpus.

The family's adapter (:mod:`mmrl.models.families`) gives the model, its processor and its special tokens;
here the tokenizer is trained and both are saved in Hugging Face format. The result is loaded back like any
checkpoint, through the Auto classes (:mod:`mmrl.models.loading`), so nothing downstream knows it is tiny.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from mmrl.config import ModelConfig, TinyModelConfig

DEFAULT_FAMILY = ModelConfig().family


def train_tokenizer(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str], *, eos: str, pad: str,
                    chat_template: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE over ``texts`` with ``special_tokens`` (ids 0.. in order), left padding and
    ``chat_template``."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=eos,
        pad_token=pad,
        additional_special_tokens=[t for t in special_tokens if t != pad],
        padding_side="left",
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def build_tiny_vlm(texts: Iterable[str], spec: TinyModelConfig, out_dir: str | Path, seed: int = 0,
                   family: str = DEFAULT_FAMILY) -> Path:
    """Train the tokenizer on ``texts``, initialise a ``family`` model at random, save both to ``out_dir``."""
    from mmrl.models.families import family_named

    out = Path(out_dir)
    model, processor = family_named(family).build_tiny(texts, spec, seed)
    tokenizer = processor.tokenizer
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
