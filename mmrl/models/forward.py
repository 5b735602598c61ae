"""The training-side forward of a VLM: the vision tower runs exactly once per call, and the policy's forward
returns token log-probs, not logits.

Hugging Face's forward calls the vision tower once for images and once more for videos, and not at all
for a text-only batch. When the vision tower is sharded (FSDP), every call is a collective, so ranks
whose micro-batches differ in media would issue different collectives and hang. Here the tower runs
once per forward on all ranks (the model family's :meth:`~mmrl.models.families.base.Family.encode_media`):
on all image and video items at once, or on a dummy input when the micro-batch has none (its output
enters the result multiplied by zero, so the backward reaches the tower too). The features are handed to
the model through ``mm_encoder_outputs``.

:class:`PolicyForward` scores response tokens inside its own forward: the language model's final hidden states
of the scored tokens go through the LM head in chunks of tokens (:mod:`mmrl.models.scoring`), so memory never
holds (batch, tokens, vocabulary) logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling

from mmrl.models.families import family_of
from mmrl.models.media import PIXEL_KEYS
from mmrl.models.scoring import Scoring, score_tokens

VALUE_HEAD_FILE = "value_head.safetensors"
PLACEHOLDER_MASK = torch.ones((1, 1, 1, 1), dtype=torch.bool)


def core_model(model: nn.Module) -> nn.Module:
    """The VLM without its LM head (vision tower + language model) inside a generation model."""
    core = getattr(model, "model", model)
    family_of(core.config)  # raises for a model of no supported family
    return core


def encode_media(core: nn.Module, inputs: dict[str, torch.Tensor], always: bool) -> tuple[dict[str, Any], torch.Tensor | None]:
    """Run the vision tower once on all images and videos of ``inputs`` (see
    :meth:`~mmrl.models.families.base.Family.encode_media`).

    Returns ``mm_encoder_outputs`` ({"image"|"video": the family's encoder output of that kind's items}) and,
    when the tower ran on the dummy input, a zero scalar that must be added to the output to keep it in the
    graph (None otherwise).
    """
    return family_of(core.config).encode_media(core, inputs, always)


def text_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``inputs`` without the pixels (the grids stay: the model needs them for its 3-D positions)."""
    return {k: v for k, v in inputs.items() if k not in PIXEL_KEYS}


class PolicyForward(nn.Module):
    """Wraps a ``*ForConditionalGeneration`` model; ``forward(inputs, responses, scored, scoring)`` -> the
    log-prob (and entropy) of each scored response token.

    It is the root module that FSDP shards, so that one call gathers every part it needs, the LM head included:
    the head runs inside this call, in chunks of tokens (:mod:`mmrl.models.scoring`), so no (B, R, V) logits
    are ever formed. ``always_run_vision`` must be set when the vision tower is sharded.
    """

    def __init__(self, model: nn.Module, always_run_vision: bool = False) -> None:
        super().__init__()
        self.model = model
        self.always_run_vision = always_run_vision

    @property
    def core(self) -> nn.Module:
        return core_model(self.model)

    def forward(self, inputs: dict[str, torch.Tensor], responses: torch.Tensor, scored: torch.Tensor,
                scoring: Scoring) -> tuple[torch.Tensor, torch.Tensor | None]:
        """inputs: prompts + responses, collated ((B, P+R) rows, :func:`mmrl.models.encoding.collate`) or packed
        (:func:`mmrl.models.packing.pack`, with ``packed_gather`` (B, R)); responses (B, R) int; scored (B, R)
        bool: the tokens to score (inside the extent the inputs were built with).

        Returns logp (B, R) and entropy (B, R) (None unless ``scoring.with_entropy``), float32, 0 where not
        scored. Only the N scored tokens' final hidden states (N, H) reach the head.
        """
        media, anchor = encode_media(self.core, inputs, self.always_run_vision)
        states = self.scored_states(inputs, media, scored)
        logp, entropy = score_tokens(states, self.model.get_output_embeddings(), responses[scored], scoring)
        logp = scatter(scored, logp)
        entropy = None if entropy is None else scatter(scored, entropy)
        return (logp if anchor is None else logp + anchor), entropy

    def scored_states(self, inputs: dict[str, torch.Tensor], media: dict[str, BaseModelOutputWithPooling],
                      scored: torch.Tensor) -> torch.Tensor:
        """The final hidden states (N, H) that predict the N scored tokens, in row-major (B, R) order.

        Unpacked (B, P+R) rows: the states at the last R+1 positions but the last. The packed (1, N) sequence:
        the states ``packed_gather`` points at.
        """
        layout = inputs.get("packed_layout")
        rest = {k: v for k, v in text_inputs(inputs).items() if k not in ("packed_gather", "packed_layout")}
        if layout is not None:
            # The layout is the attention's mask (mmrl.models.packed_attention); a 4-D placeholder stops
            # transformers from building an (N, N) one.
            rest |= {"packed_layout": layout, "attention_mask": PLACEHOLDER_MASK.to(inputs["input_ids"].device)}
        hidden = self.core(**rest, mm_encoder_outputs=media or None, use_cache=False).last_hidden_state
        if layout is not None:
            layout.check_used()
            return hidden[0][inputs["packed_gather"][scored]]
        return hidden[:, -(scored.shape[1] + 1) : -1][scored]


def scatter(scored: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """values (N,) of the scored tokens -> (B, R), 0 where ``scored`` (B, R) is False."""
    return torch.zeros(scored.shape, dtype=values.dtype, device=values.device).masked_scatter(scored, values)


class ValueModel(nn.Module):
    """The critic: a VLM backbone (no LM head) and a scalar value head on every position.

    ``forward(inputs, width)`` -> values (B, width) of the states *before* each of the last ``width``
    tokens, i.e. aligned with the log-probs of a width-``width`` response.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int, always_run_vision: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        self.always_run_vision = always_run_vision
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @property
    def core(self) -> nn.Module:
        return self.backbone

    @classmethod
    def from_policy(cls, model: nn.Module) -> ValueModel:
        core = core_model(model)
        return cls(core, family_of(core.config).text_hidden_size(core))

    def forward(self, inputs: dict[str, torch.Tensor], width: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """inputs: collated (B, P+width), responses right-padded to ``width``.

        Without ``lengths`` (the critic): values (B, width) float32 of the states before each response token.
        With ``lengths`` (B,) int, the real response tokens of each row (a reward model): (B,) float32, the
        head on the hidden state of each row's last response token, i.e. a score of the whole sequence.
        (One method, so that FSDP's hooks on the root's ``forward`` gather the parameters either way.)
        """
        media, anchor = encode_media(self.backbone, inputs, self.always_run_vision)
        hidden = self.backbone(**text_inputs(inputs), mm_encoder_outputs=media or None, use_cache=False).last_hidden_state
        if lengths is None:
            states = hidden[:, -(width + 1) : -1]
        else:
            last = hidden.shape[1] - width + lengths.to(hidden.device).long().clamp(1, width) - 1
            states = hidden[torch.arange(len(last), device=hidden.device), last]
        values = self.value_head(states).squeeze(-1).float()
        return values if anchor is None else values + anchor

    def sequence_scores(self, inputs: dict[str, torch.Tensor], width: int, lengths: torch.Tensor) -> torch.Tensor:
        """inputs (B, P+width), lengths (B,) -> (B,) float32: ``self(inputs, width, lengths)``."""
        return self(inputs, width, lengths)

    def save_head(self, folder: str | Path) -> Path:
        """Write the scalar head as ``<folder>/value_head.safetensors``."""
        path = Path(folder) / VALUE_HEAD_FILE
        save_file({k: v.detach().cpu().contiguous() for k, v in self.value_head.state_dict().items()}, str(path))
        return path

    def load_head(self, folder: str | Path) -> None:
        """Load the scalar head written by :meth:`save_head` (a reward model's checkpoint)."""
        path = Path(folder) / VALUE_HEAD_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{folder} has no {VALUE_HEAD_FILE}: it is not a reward-model checkpoint; "
                                    "train one with `make rm` (its checkpoint is <rm.out_dir>/checkpoint)")
        state = load_file(str(path))
        self.value_head.load_state_dict({k: v.to(self.value_head.weight.dtype) for k, v in state.items()})
