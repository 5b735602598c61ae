"""Load any Hugging Face VLM + processor by path through the Auto classes (tiny or real)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

from mmrl.models.families import Family, family_of, family_of_processor
from mmrl.models.fused import fuse
from mmrl.patches import sdpa_gqa

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_checkpoint(path: str | Path, what: str = "model") -> Path:
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{what} checkpoint {folder} has no config.json; run the stage that writes it "
            "(make model / make sft / make rl) or point the config at a Hugging Face checkpoint folder"
        )
    return folder


def checkpoint_family(path: str | Path) -> Family:
    """The model family of a checkpoint folder, from its config.json's ``model_type``."""
    return family_of(AutoConfig.from_pretrained(check_checkpoint(path)))


def load_model(path: str | Path, dtype: str = "float32", attn: str = "sdpa", device: torch.device | str = "cpu",
               compiled: bool = False) -> Any:
    """A Hugging Face VLM from a local folder, with its family's patches installed (:meth:`Family.prepare`),
    grouped-query attention without copies on CPU (:mod:`mmrl.patches.sdpa_gqa`) and, with ``compiled``
    (``model.compile``), its element-wise parts fused (:mod:`mmrl.models.fused`)."""
    folder = check_checkpoint(path)
    config = AutoConfig.from_pretrained(folder)
    family_of(config).prepare()
    sdpa_gqa.apply()
    model = AutoModelForImageTextToText.from_pretrained(folder, config=config, dtype=DTYPES[dtype],
                                                        attn_implementation=attn)
    model = model.to(device)
    if compiled:
        fuse(model)
    return model


def load_processor(path: str | Path) -> Any:
    """The checkpoint's processor (left padding); it must be its model family's processor class."""
    family = checkpoint_family(path)
    processor = AutoProcessor.from_pretrained(check_checkpoint(path))
    if family_of_processor(processor) is not family:
        raise ValueError(f"checkpoint {path}: its processor is a {type(processor).__name__}, but its model is a "
                         f"{family.name} ({family.processor_class}); save the family's processor with the model")
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


def patch_factor(processor: Any) -> int:
    """The side, in pixels, that image sizes must be multiples of for ``processor`` (its family's
    :meth:`~mmrl.models.families.base.Family.size_factor`, e.g. 28 for 14-pixel patches merged 2 x 2)."""
    return family_of_processor(processor).size_factor(processor)


def grid_pixels(processor: Any) -> int:
    """Pixels per cell side of the (t, h, w) grids ``processor``'s encodings give each image."""
    return family_of_processor(processor).grid_pixels(processor)
