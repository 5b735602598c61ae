"""Load any Hugging Face VLM + processor by path through the Auto classes (tiny or real)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor


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


def image_patch_factor(path: str | Path) -> int:
    """The side, in pixels, that image sizes must be multiples of for the checkpoint's processor:
    patch size times spatial merge size (28 for Qwen2/2.5-VL)."""
    from transformers import AutoImageProcessor

    folder = Path(path)
    try:
        if not folder.is_dir():
            raise OSError(f"{folder} is not a folder")
        processor = AutoImageProcessor.from_pretrained(folder)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(
            f"model.path={folder} has no image processor to size the images by ({err}); run `make model` "
            "first or point model.path at the Hugging Face checkpoint you will train"
        ) from err
    return int(processor.patch_size) * int(getattr(processor, "merge_size", 1))
