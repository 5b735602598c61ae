"""Build a tiny VLM of any family from scratch: random weights, a BPE tokenizer trained on a task corpus.

The family's adapter (:mod:`mmrl.models.families`) gives the model, its processor and its special tokens, with
its tokenizer trained by :func:`mmrl.models.tokenizer.train_tokenizer`; here both are saved in Hugging Face
format. The result is loaded back like any checkpoint, through the Auto classes (:mod:`mmrl.models.loading`), so
nothing downstream knows it is tiny.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from mmrl.config import ModelConfig, TinyModelConfig
from mmrl.models.families import family_named
from mmrl.models.tokenizer import train_tokenizer

__all__ = ["DEFAULT_FAMILY", "build_tiny_vlm", "count_parameters", "train_tokenizer"]

DEFAULT_FAMILY = ModelConfig().family


def build_tiny_vlm(texts: Iterable[str], spec: TinyModelConfig, out_dir: str | Path, seed: int = 0,
                   family: str = DEFAULT_FAMILY) -> Path:
    """Train the tokenizer on ``texts``, initialise a ``family`` model at random, save both to ``out_dir``."""
    out = Path(out_dir)
    model, processor = family_named(family).build_tiny(texts, spec, seed)
    tokenizer = processor.tokenizer
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def count_parameters(model: torch.nn.Module) -> int:
    """The number of parameters of ``model``."""
    return sum(p.numel() for p in model.parameters())
