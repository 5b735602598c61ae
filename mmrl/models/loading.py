"""Load any Hugging Face VLM + processor by path through the Auto classes (tiny or real)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from mmrl.patches import patch_embed, qwen_mrope


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_checkpoint(path: str | Path, what: str = "model") -> Path:
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{what} checkpoint {folder} has no config.json; run the stage that writes it "
            "(make model / make sft / make rl) or point the config at a Hugging Face checkpoint folder"
        )
    return folder


def load_model(path: str | Path, dtype: str = "float32", attn: str = "sdpa", device: torch.device | str = "cpu") -> Any:
    """A Hugging Face VLM from a local folder, with mmrl's Qwen position-id and patch-embedding patches
    installed (see :mod:`mmrl.patches.qwen_mrope`, :mod:`mmrl.patches.patch_embed`)."""
    qwen_mrope.apply()
    patch_embed.apply()
    folder = check_checkpoint(path)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=DTYPES[dtype], attn_implementation=attn)
    return model.to(device)


def load_processor(path: str | Path) -> Any:
    processor = AutoProcessor.from_pretrained(check_checkpoint(path))
    processor.tokenizer.padding_side = "left"
    return processor


def save_checkpoint(
    model: torch.nn.Module, processor: Any, path: str | Path, state_dict: dict[str, torch.Tensor] | None = None
) -> Path:
    """Write a Hugging Face checkpoint folder: ``model``'s config and ``state_dict`` (default: its own
    weights, Hugging Face names), and the processor. ``model`` only supplies the config and the on-disk
    naming when ``state_dict`` is given: its parameters may be sharded or empty."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, state_dict=state_dict)
    processor.save_pretrained(folder)
    return folder


def patch_factor(image_processor: Any) -> int:
    """The side, in pixels, that image sizes must be multiples of for this image processor: patch size
    times spatial merge size (28 for Qwen2/2.5-VL)."""
    return int(image_processor.patch_size) * int(getattr(image_processor, "merge_size", 1))
