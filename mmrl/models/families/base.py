"""What one model family supplies: :class:`Family`, the declarations and hooks the library reads instead of
knowing a family.

A family is one transformers ``*ForConditionalGeneration`` class and its processor. It declares, in its class:

- **groups**: :attr:`Family.groups`, the named parts of its model (vision tower, its blocks, projector,
  language model, its decoder layers, head; :mod:`mmrl.models.families.groups`), which layouts, freezing,
  activation checkpointing and LoRA read through :meth:`Family.vision`, :meth:`Family.vision_blocks` and
  :meth:`Family.decoder_layers`;
- **tool calls**: :attr:`Family.tool_calls`, how its policy writes a tool call and how the tools and their
  outputs are put to it (:mod:`mmrl.models.tool_calls`);

and the library holds only its own forms and asks the family to translate:

- **encoding**: the processor's output -> an :class:`~mmrl.models.prompt.EncodedPrompt` (pixels as the
  family's tower takes them, a (t, h, w) grid per image / video), the vision tokens a policy must not emit;
- **positions**: (A, B, L) position ids, A = :attr:`Family.position_axes` (3 for Qwen's mrope, 1 for plain
  1-D positions), and their form for the model (:meth:`Family.model_positions`);
- **vision**: the tower run once per forward (:meth:`Family.encode_media`), its features handed back as
  ``mm_encoder_outputs``, a dummy input when a micro-batch has no media;
- **engines**: the media an engine takes, the weight names it wants.

The defaults here are the plain ones (1-D positions, names as Hugging Face has them); a family overrides
what differs. A family imports the media forms (:mod:`mmrl.models.media`), never the encoding path that
dispatches over the families (:mod:`mmrl.models.encoding`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mmrl.models.media import frames_array, video_metadata

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from mmrl.config import TinyModelConfig
    from mmrl.models.families.groups import ModelGroups
    from mmrl.models.prompt import EncodedPrompt
    from mmrl.models.tool_calls import ToolCallFormat
    from mmrl.schema import Video


def plain_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """attention_mask (B, L) -> (1, B, L) int64 1-D positions: real tokens count from 0, padding stays 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[None]


class Family:
    """One model family. Subclasses set the class attributes and override the hooks that differ."""

    name: str = ""
    """The registry key, as ``model.family`` spells it (``make model``)."""
    model_type: str = ""
    """``config.model_type`` of this family's checkpoints: how a checkpoint's family is found."""
    processor_class: str = ""
    """The transformers processor class its checkpoints load as: how a processor's family is found."""
    position_axes: int = 1
    """Rows of the position ids: 1 (plain 1-D positions) or 3 (time, height, width)."""
    takes_video: bool = False
    """Whether the family's processor and model take ``<video>`` prompts."""
    media_sizing: str = "mmrl"
    """How data prep sizes the family's images and samples its videos (:data:`data_prep.pixels.SIZINGS`): ``qwen``,
    qwen-vl-utils' rules, for the families Qwen's tools and vLLM's processors serve that way."""
    engine_media_kinds: tuple[str, ...] = ("image",)
    """The media kinds vLLM's implementation of the family takes."""
    groups: ModelGroups
    """The named parts of the family's model (:mod:`mmrl.models.families.groups`); every family declares them."""
    tool_calls: ToolCallFormat
    """How the family's policy writes tool calls and reads the tools' list and outputs
    (:mod:`mmrl.models.tool_calls`); every family declares one."""

    # ---- checkpoints ---------------------------------------------------------------------------

    def prepare(self) -> None:
        """Install the family's patches to third-party classes (:mod:`mmrl.patches`) before a model loads."""

    def build_tiny(self, texts: Iterable[str], spec: TinyModelConfig, seed: int) -> tuple[nn.Module, Any]:
        """A random-init model of this family sized by ``spec`` and its processor, with a tokenizer trained
        on ``texts`` (:mod:`mmrl.models.tiny` saves them)."""
        raise NotImplementedError(f"family {self.name} has no tiny build")

    # ---- modules -------------------------------------------------------------------------------

    def vision(self, core: nn.Module) -> nn.Module:
        """The vision tower of ``core`` (the model without its LM head): the part ``*.vision`` configures."""
        return self.groups.vision_module(core)

    def vision_blocks(self, core: nn.Module) -> Sequence[nn.Module]:
        """The tower's repeated blocks (one FSDP unit / checkpointed region each)."""
        return self.groups.vision_block_modules(core)

    def decoder_layers(self, core: nn.Module) -> Sequence[nn.Module]:
        """The language model's decoder layers (one FSDP unit / checkpointed region each)."""
        return self.groups.decoder_layer_modules(core)

    def text_hidden_size(self, core: nn.Module) -> int:
        """Width of the language model's hidden states (a value head's input)."""
        return int(core.config.text_config.hidden_size)

    # ---- encoding ------------------------------------------------------------------------------

    def chat_text(self, processor: Any, conversation: list[dict[str, Any]]) -> str:
        """The chat template on ``conversation`` (content items), with the generation prompt, untokenised."""
        return processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)

    def encode(self, processor: Any, text: str, images: Sequence[Any], videos: Sequence[Video]) -> dict[str, Any]:
        """The processor on one prompt's chat text and media -> the EncodedPrompt fields: input_ids (P,),
        mm_token_type_ids (P,) (0 text, 1 image, 2 video) and the media fields the family fills."""
        raise NotImplementedError

    def encode_many(self, processor: Any, texts: Sequence[str], images: Sequence[Sequence[Any]],
                    videos: Sequence[Sequence[Video]]) -> list[dict[str, Any]]:
        """:meth:`encode` of several prompts (``texts[i]`` with ``images[i]`` and ``videos[i]``); a family may run
        its processor once on all of them, for the same fields as one call each."""
        return [self.encode(processor, t, i, v) for t, i, v in zip(texts, images, videos, strict=True)]

    def vision_tokens(self, tokenizer: PreTrainedTokenizerFast) -> list[str]:
        """The tokens of ``tokenizer`` that only the processor may place (a sampled one would desynchronise
        the media features): they are banned from generation and masked in scoring."""
        raise NotImplementedError

    def grid_pixels(self, processor: Any) -> int:
        """Pixels per cell side of the (t, h, w) grids the encoding gives each image."""
        raise NotImplementedError

    def size_factor(self, processor: Any) -> int:
        """The side, in pixels, that data prep makes image sizes multiples of."""
        return self.grid_pixels(processor)

    # ---- positions -----------------------------------------------------------------------------

    def positions(self, core: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Collated (B, L) inputs (ids, attention mask, mm_token_type_ids, grids) -> (A, B, L) int64 positions."""
        return plain_positions(inputs["attention_mask"])

    def prompt_positions(self, core: nn.Module, prompt: EncodedPrompt) -> torch.Tensor:
        """(A, P) positions of one unpadded prompt's tokens."""
        return torch.arange(len(prompt))[None]

    def model_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """(A, B, L) positions -> the ``position_ids`` the model's forward takes."""
        return positions if self.position_axes > 1 else positions[0]

    # ---- vision --------------------------------------------------------------------------------

    def encode_media(self, core: nn.Module, inputs: dict[str, torch.Tensor],
                     always: bool) -> tuple[dict[str, Any], torch.Tensor | None]:
        """Run the vision tower once on every image and video of collated ``inputs``.

        Returns ``mm_encoder_outputs`` ({kind: the model's encoder output for that kind's items, in the batch's
        order}) and, when ``always`` and there is no media (the tower ran on a dummy input so that a sharded
        tower's collectives happen on every rank), a zero scalar to add to the output; else None.
        """
        raise NotImplementedError

    # ---- engines -------------------------------------------------------------------------------

    def engine_media(self, prompt: EncodedPrompt) -> dict[str, list[Any]]:
        """vLLM's ``multi_modal_data`` for ``prompt``: its source images and videos (frames + metadata)."""
        media: dict[str, list[Any]] = {}
        if prompt.source_images:
            media["image"] = list(prompt.source_images)
        if prompt.source_videos:  # already sampled: vLLM must not resample the frames
            media["video"] = [(frames_array(v), {**video_metadata(v), "do_sample_frames": False})
                              for v in prompt.source_videos]
        unsupported = sorted(set(media) - set(self.engine_media_kinds))
        if unsupported:
            raise ValueError(f"prompt {prompt.name}: vLLM's {self.name} takes no {unsupported[0]} input; "
                             "use rollout.engine=hf for these prompts")
        return media

    def engine_weights(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face name, tensor) -> the names vLLM's loader takes (by default the same: it maps them)."""
        yield from named

    def __repr__(self) -> str:
        return f"<family {self.name}>"
