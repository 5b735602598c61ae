"""Model families: one adapter module per family, and the table that finds a checkpoint's family.

===========  =========================  ========================  =====================================  ==========
family       transformers class         positions                 media                                  tool calls
===========  =========================  ========================  =====================================  ==========
qwen2_vl     Qwen2VLForConditional...   mrope (t, h, w)           images, videos (patches, merged 2x2)   qwen
qwen2_5_vl   Qwen2_5_VLForConditional   mrope, video time scaled  images, videos (windowed tower)        qwen
qwen3_vl     Qwen3VLForConditional...   interleaved mrope         images, videos (deepstack features,    qwen
                                                                  frames separated by timestamps)
smolvlm      SmolVLMForConditional...   plain 1-D                 images, videos as frames (fixed-size   qwen (none
                                                                  images, pixel shuffle)                 of its own)
===========  =========================  ========================  =====================================  ==========

Everything family-specific is declared in the family's module: its model groups (the vision tower, its blocks,
the projector, the language model, its decoder layers, the head: :mod:`mmrl.models.families.groups`), its
tool-call format (:mod:`mmrl.models.tool_calls`), how it turns a prompt's media into model inputs, its
positions, its vision pass and its tiny build (:class:`~mmrl.models.families.base.Family`).

The family is read from the checkpoint (:func:`family_of` takes its ``config.model_type``; a processor's by
its class, :func:`family_of_processor`), never configured by hand; only ``make model`` names one
(``model.family``) to build a tiny model of it. A new family is one module with a :class:`Family` subclass
and one line of :data:`FAMILIES`.
"""

from __future__ import annotations

from typing import Any

from mmrl.models.families.base import Family
from mmrl.models.families.groups import ModelGroups
from mmrl.models.families.qwen2_5_vl import QWEN2_5_VL
from mmrl.models.families.qwen2_vl import QWEN2_VL
from mmrl.models.families.qwen3_vl import QWEN3_VL
from mmrl.models.families.smolvlm import SMOLVLM
from mmrl.models.tool_calls import ToolCallFormat


def check_family(family: Family) -> Family:
    """``family``, once it is checked to declare what every family must (its groups and tool-call format)."""
    for attribute, kind in (("groups", ModelGroups), ("tool_calls", ToolCallFormat)):
        if not isinstance(getattr(family, attribute, None), kind):
            raise TypeError(f"model family {family.name} declares no {attribute} ({kind.__name__}); set it in its "
                            "class (mmrl/models/families/)")
    return family


# The families by name (``Family.name``), one line each.
FAMILIES: dict[str, Family] = {family.name: check_family(family) for family in (
    QWEN2_VL,
    QWEN2_5_VL,
    QWEN3_VL,
    SMOLVLM,
)}

__all__ = ["FAMILIES", "Family", "check_family", "family_named", "family_of", "family_of_processor"]


def family_named(name: str) -> Family:
    """The family registered as ``name`` (``model.family`` for ``make model``)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; allowed: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_of(config: Any) -> Family:
    """The family of a model from its (Hugging Face) config, by ``config.model_type``."""
    model_type = getattr(config, "model_type", None)
    for family in FAMILIES.values():
        if family.model_type == model_type:
            return family
    raise ValueError(f"model_type {model_type!r} is not a supported model family; supported: "
                     f"{', '.join(f.model_type for f in FAMILIES.values())} (add one under mmrl/models/families/)")


def family_of_processor(processor: Any) -> Family:
    """The family of a processor, by its class (:func:`mmrl.models.loading.load_processor` checks that it is
    its checkpoint's family)."""
    name = type(processor).__name__
    for family in FAMILIES.values():
        if family.processor_class == name:
            return family
    raise ValueError(f"processor {name} belongs to no supported model family; supported: "
                     f"{', '.join(f.processor_class for f in FAMILIES.values())}")

