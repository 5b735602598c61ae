"""What one model family supplies: :class:`Family`, the hooks the library calls instead of knowing a family.

A family is one transformers ``*ForConditionalGeneration`` class and its processor. The library holds only
its own forms and asks the family to translate:

- **modules**: the vision tower, its blocks, the decoder layers (layouts, freezing, checkpointing);
- **encoding**: the processor's output -> an :class:`~mmrl.models.encoding.EncodedPrompt` (pixels as the
  family's tower takes them, a (t, h, w) grid per image / video), the vision tokens a policy must not emit;
- **positions**: (A, B, L) position ids, A = :attr:`Family.position_axes` (3 for Qwen's mrope, 1 for plain
  1-D positions), and their form for the model (:meth:`Family.model_positions`);
- **vision**: the tower run once per forward (:meth:`Family.encode_media`), its features handed back as
  ``mm_encoder_outputs``, a dummy input when a micro-batch has no media;
- **engines**: the media an engine takes, the weight names it wants.

The defaults here are the plain ones (1-D positions, names as Hugging Face has them); a family overrides
what differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from mmrl.config import TinyModelConfig
    from mmrl.models.encoding import EncodedPrompt
    from mmrl.schema import Video

# Media kinds, each with its pixels field and its grids field of an EncodedPrompt / a collated batch.
MEDIA_KINDS = (("image", "pixel_values", "image_grid_thw"), ("video", "pixel_values_videos", "video_grid_thw"))


def shared_keys(kind: str) -> tuple[str, str]:
    """The keys ``collate(share_media=True)`` adds for ``kind``: distinct grids (N, 3), item -> distinct (M,)."""
    return f"{kind}_grid_thw_distinct", f"{kind}_distinct_index"


def present_media(inputs: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """(kind, pixels, grids of the pixels' items, item -> pixel item index or None) for each kind in ``inputs``.

    With shared media (``collate(share_media=True)``) the pixels hold each distinct item once and the index
    says which distinct item each of the batch's items is; otherwise the index is None.
    """
    out = []
    for kind, pixels_key, grid_key in MEDIA_KINDS:
        if inputs.get(pixels_key) is None:
            continue
        distinct, index = shared_keys(kind)
        out.append((kind, inputs[pixels_key], inputs.get(distinct, inputs[grid_key]), inputs.get(index)))
    return out


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
        raise NotImplementedError

    def vision_blocks(self, core: nn.Module) -> Sequence[nn.Module]:
        """The tower's repeated blocks (one FSDP unit / checkpointed region each)."""
        raise NotImplementedError

    def decoder_layers(self, core: nn.Module) -> Sequence[nn.Module]:
        """The language model's decoder layers (one FSDP unit / checkpointed region each)."""
        raise NotImplementedError

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
        from mmrl.models.encoding import frames_array, video_metadata

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
