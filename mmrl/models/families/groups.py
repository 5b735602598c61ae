"""The model groups of a family: the named parts of its model, declared once per family as module paths.

=============  ==========================================================================================
group          what reads it
=============  ==========================================================================================
vision         the vision tower: the part ``*.vision`` lays out and freezes (:mod:`mmrl.parallel.sharding`,
               :mod:`mmrl.workers.model_builder`), LoRA's ``include_vision`` (:mod:`mmrl.models.lora`)
vision_blocks  the tower's repeated blocks: one FSDP unit / checkpointed region each
projector      vision features -> the language model's width; inside the tower (Qwen's merger: laid out and
               frozen with it) or beside it (SmolVLM's connector: laid out with the language model)
llm            the language model: embeddings, decoder layers, final norm
decoder_layers its layers: one FSDP unit / checkpointed region each, LoRA's targets (:mod:`mmrl.models.lora`)
head           the LM head, on the generation model beside the core; never adapted by LoRA
=============  ==========================================================================================

Paths are relative to the core (the ``*ForConditionalGeneration`` model's ``model``: the VLM without its LM
head), but ``head``, relative to the generation model. :meth:`ModelGroups.prefixes` gives each group's prefix of
the Hugging Face parameter names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

CORE = "model"  # the core's attribute in a Hugging Face *ForConditionalGeneration model


@dataclass(frozen=True)
class ModelGroups:
    """One family's groups (see the module's docstring), as dotted module paths."""

    vision: str
    vision_blocks: str
    projector: str
    llm: str
    decoder_layers: str
    head: str = "lm_head"

    def vision_module(self, core: nn.Module) -> nn.Module:
        """The vision tower of ``core``."""
        return core.get_submodule(self.vision)

    def vision_block_modules(self, core: nn.Module) -> Sequence[nn.Module]:
        """The tower's blocks, in order."""
        return core.get_submodule(self.vision_blocks)

    def projector_module(self, core: nn.Module) -> nn.Module:
        """The projector of vision features into the language model."""
        return core.get_submodule(self.projector)

    def llm_module(self, core: nn.Module) -> nn.Module:
        """The language model of ``core``."""
        return core.get_submodule(self.llm)

    def decoder_layer_modules(self, core: nn.Module) -> Sequence[nn.Module]:
        """The language model's decoder layers, in order."""
        return core.get_submodule(self.decoder_layers)

    def prefixes(self) -> dict[str, str]:
        """Group -> the prefix of its parameters' names in the Hugging Face model (``model.visual.``, ...)."""
        inside = {"vision": self.vision, "vision_blocks": self.vision_blocks, "projector": self.projector,
                  "llm": self.llm, "decoder_layers": self.decoder_layers}
        return {**{group: f"{CORE}.{path}." for group, path in inside.items()}, "head": f"{self.head}."}

    def group_of(self, name: str) -> str | None:
        """The innermost group holding the Hugging Face parameter ``name`` (``projector`` before ``vision``,
        ``decoder_layers`` before ``llm``), or None for a parameter of no group."""
        held = [(len(prefix), group) for group, prefix in self.prefixes().items() if name.startswith(prefix)]
        return max(held)[1] if held else None
