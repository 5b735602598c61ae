"""Prompt sharing: one packed sequence per distinct prompt, holding the prompt once and its k responses after it.

The n samples of a prompt share its media and its prompt tokens. Scored one row per sample, the prompt is
run n times; packed, it runs once::

    row g:  [pad ... pad | prompt g | response 1 | response 2 | ... | response k]

An attention mask lets every response token see the prompt and the earlier tokens of its own response only;
every token keeps the position it has in the unpacked row (the family's, 3-D for some: a response token j
sits at the prompt's largest position + 1 + j). Each response takes its own extent, not the batch's longest,
so a long tail of lengths packs into the tokens drawn, not into k times the longest. Each response token is therefore computed from exactly the inputs of
the unpacked forward, so the log-probs agree up to floating-point summation order (tested in
tests/unit/test_packing.py against the plain forward, log-probs and gradients).

Padding tokens (left of the prompt, right of a response's end) are keys no query sees; each attends to
itself only, so that no softmax row is empty (an empty row is NaN, and NaN would reach the gradients).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mmrl.models.encoding import MEDIA_FIELDS, EncodedPrompt
from mmrl.models.families import family_of
from mmrl.perf.text import text_costs

PACKED_KEYS = ("packed_gather", "packed_mask", "position_ids")


@dataclass
class Groups:
    """The distinct prompts of a batch (by identity, in order of first appearance) and each row's group."""

    prompts: list[EncodedPrompt]
    index: list[int]  # row -> group
    slot: list[int]  # row -> its place among the group's responses

    @classmethod
    def of(cls, prompts: Sequence[EncodedPrompt]) -> Groups:
        order: dict[int, int] = {}
        counts: list[int] = []
        index, slot = [], []
        for prompt in prompts:
            group = order.setdefault(id(prompt), len(order))
            if group == len(counts):
                counts.append(0)
            index.append(group)
            slot.append(counts[group])
            counts[group] += 1
        distinct = list({id(p): p for p in prompts}.values())
        return cls(distinct, index, slot)

    def sizes(self) -> list[int]:
        return [self.index.count(g) for g in range(len(self.prompts))]


def prompt_positions(core: torch.nn.Module, prompt: EncodedPrompt) -> torch.Tensor:
    """(A, P) int64 positions of one prompt's tokens (A: the family's position axes)."""
    return family_of(core.config).prompt_positions(core, prompt)


def pack(
    core: torch.nn.Module,
    prompts: Sequence[EncodedPrompt],
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    pad_token_id: int,
) -> dict[str, torch.Tensor]:
    """Model inputs for the packed forward of B (prompt, response) rows.

    prompts: B encoded prompts (repeats by identity share a packed row); responses, response_mask: (B, R), the
    mask the attention extent (a hole, a token the policy did not sample, is context like any response token).
    Returns input_ids, mm_token_type_ids (G, W); position_ids (A, G, W) (the family's form: (G, W) for plain
    1-D positions); packed_mask (G, 1, W, W) bool, True where a
    query may attend; packed_gather (B, R) int64: the flat index
    into the (G*W) positions of the state that predicts each response token; and the distinct prompts' media.
    """
    groups = Groups.of(prompts)
    family = family_of(core.config)
    extents = response_extents(response_mask)
    lengths = packed_lengths(groups, extents)
    total = max(lengths)
    count = len(groups.prompts)
    input_ids = torch.full((count, total), pad_token_id, dtype=torch.long)
    mm_types = torch.zeros((count, total), dtype=torch.long)
    positions = torch.zeros((family.position_axes, count, total), dtype=torch.long)
    segment = torch.full((count, total), -1, dtype=torch.long)  # -1 padding, 0 prompt, i + 1 response slot i
    valid = torch.zeros((count, total), dtype=torch.bool)
    starts, filled = [], []
    for g, prompt in enumerate(groups.prompts):
        start = total - lengths[g]
        end = start + len(prompt)
        input_ids[g, start:end] = prompt.input_ids
        mm_types[g, start:end] = prompt.mm_token_type_ids
        prompt_pos = prompt_positions(core, prompt)
        positions[:, g, start:end] = prompt_pos
        segment[g, start:end] = 0
        valid[g, start:end] = True
        starts.append((end, int(prompt_pos.max()) + 1))
        filled.append(end)
    # Token 0 is predicted by the prompt's last state, token j > 0 by response token j - 1; a column past the
    # response's extent is never scored and points at the prompt's last state.
    gather = torch.zeros(responses.shape, dtype=torch.long)
    for row, (g, slot, extent) in enumerate(zip(groups.index, groups.slot, extents)):
        end, next_pos = starts[g]
        first, filled[g] = filled[g], filled[g] + extent
        input_ids[g, first : first + extent] = responses[row, :extent]
        positions[:, g, first : first + extent] = torch.arange(next_pos, next_pos + extent)
        segment[g, first : first + extent] = slot + 1
        valid[g, first : first + extent] = response_mask[row, :extent].bool()
        gather[row] = g * total + end - 1
        gather[row, 1:extent] = g * total + first + torch.arange(max(extent - 1, 0))
    out = {"input_ids": input_ids, "mm_token_type_ids": mm_types, "position_ids": family.model_positions(positions),
           "packed_mask": attention_mask(segment, valid), "packed_gather": gather}
    for key in MEDIA_FIELDS:
        present = [getattr(p, key) for p in groups.prompts if getattr(p, key) is not None]
        if present:
            out[key] = torch.cat(present)
    return out


def response_extents(response_mask: torch.Tensor) -> list[int]:
    """response_mask (B, R) -> each row's extent: the columns up to its last masked-in one (a hole inside it
    counts; 0 for an empty row)."""
    columns = torch.arange(1, response_mask.shape[1] + 1)
    return [int((columns * (row > 0)).max()) for row in response_mask.cpu()]


def attention_mask(segment: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """segment, valid (G, W) -> bool (G, 1, W, W): query q sees key k <= q when k is valid and k is a prompt
    token or in q's own response; every token sees itself."""
    width = segment.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    same = (segment[:, None, :] == 0) | (segment[:, None, :] == segment[:, :, None])
    allowed = causal & same & valid[:, None, :]
    allowed |= torch.eye(width, dtype=torch.bool)
    return allowed[:, None]


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool attention mask -> the additive form eager attention expects (0 or the dtype's minimum)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def packed_lengths(groups: Groups, extents: Sequence[int]) -> list[int]:
    """Each packed row's length: its prompt and the extents of its responses."""
    lengths = [len(p) for p in groups.prompts]
    for g, extent in zip(groups.index, extents):
        lengths[g] += extent
    return lengths


def worth_packing(config: object, prompts: Sequence[EncodedPrompt], response_mask: torch.Tensor) -> bool:
    """Whether the packed forward costs fewer FLOPs than the plain one (rows of prompt + response).

    Packing runs a repeated prompt once, but its row holds all the prompt's responses, and attention is
    quadratic in a row's length: k long responses in one row cost more than k rows. Both layouts are costed as
    the forward computes them, padding included: per position the language model's dense layers, per
    (query, key) pair its attention (:func:`text_costs`). A response holding media (an agent episode's tool
    images) is never packed: its positions are the family's, not consecutive ones.
    """
    if any(p.response_mm_types is not None and bool(p.response_mm_types.any()) for p in prompts):
        return False
    groups = Groups.of(prompts)
    if len(groups.prompts) == len(prompts):
        return False
    costs = text_costs(config)
    extents = response_extents(response_mask)
    packed_row = max(packed_lengths(groups, extents))
    plain_row = max(len(p) for p in prompts) + max(extents)
    packed = len(groups.prompts) * costs.forward(packed_row, packed_row**2, 0)
    plain = len(prompts) * costs.forward(plain_row, plain_row**2, 0)
    return packed < plain
