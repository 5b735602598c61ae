"""Prompt sharing: one flat packed sequence holding each distinct prompt once and its responses after it.

The n samples of a prompt share its media and its prompt tokens. Scored one row per sample, the prompt is
run n times; packed, it runs once::

    (1, N):  [prompt 1 | response 1.1 | response 1.2 | ... | prompt 2 | response 2.1 | ...]

Each response takes its own extent, not the batch's longest, and nothing pads the sequence, so every layer but
attention computes exactly the tokens drawn. Attention (:mod:`mmrl.models.packed_attention`) lets every response
token see its prompt and the earlier tokens of its own response only, and computes only those pairs (plus the
padding of its gathered rows); every token keeps the position it has in the unpacked row (the family's, 3-D for
some: a response token j sits at the prompt's largest position + 1 + j). Each response token is therefore
computed from exactly the inputs of the unpacked forward, so the log-probs agree up to floating-point summation
order (tested in tests/unit/test_packing.py against the plain forward, log-probs and gradients).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mmrl.models.encoding import MEDIA_FIELDS, EncodedPrompt
from mmrl.models.families import family_of
from mmrl.models.packed_attention import PackedLayout, install, length_buckets

PACKED_KEYS = ("packed_gather", "packed_layout", "position_ids")


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
) -> dict[str, Any]:
    """Model inputs for the packed forward of B (prompt, response) rows.

    prompts: B encoded prompts (repeats by identity share their prompt tokens); responses, response_mask: (B, R),
    the mask the attention extent (a hole, a token the policy did not sample, is context like any response token).
    Returns input_ids, mm_token_type_ids (1, N); position_ids (A, 1, N) (the family's form: (1, N) for plain
    1-D positions); packed_layout, a :class:`~mmrl.models.packed_attention.PackedLayout`; packed_gather (B, R)
    int64: the flat index of the state that predicts each response token; and the distinct prompts' media.
    """
    install()
    groups = Groups.of(prompts)
    family = family_of(core.config)
    extents = torch.tensor(response_extents(response_mask), dtype=torch.long)
    group = torch.tensor(groups.index, dtype=torch.long)
    lengths = torch.tensor([len(p) for p in groups.prompts], dtype=torch.long)
    prompt_start, response_start = segment_starts(lengths, group, extents)
    total = int(lengths.sum() + extents.sum())
    prompt_width, width = int(lengths.max()), responses.shape[1]
    # Gathered rows: each prompt's (G, P) and each response's (B, R) flat indices, and which of them are tokens.
    prompt_real = torch.arange(prompt_width)[None] < lengths[:, None]
    response_real = torch.arange(width)[None] < extents[:, None]
    prompt_index = (prompt_start[:, None] + torch.arange(prompt_width)) * prompt_real
    response_index = (response_start[:, None] + torch.arange(width)) * response_real
    input_ids = torch.full((total,), pad_token_id, dtype=torch.long)
    mm_types = torch.zeros(total, dtype=torch.long)
    input_ids[prompt_index[prompt_real]] = torch.cat([p.input_ids for p in groups.prompts])
    mm_types[prompt_index[prompt_real]] = torch.cat([p.mm_token_type_ids for p in groups.prompts])
    input_ids[response_index[response_real]] = responses[response_real]
    # Positions: each prompt's the family's; response token j at the prompt's largest position + 1 + j.
    prompt_pos = [prompt_positions(core, p) for p in groups.prompts]
    positions = torch.zeros((family.position_axes, total), dtype=torch.long)
    positions[:, prompt_index[prompt_real]] = torch.cat(prompt_pos, dim=1)
    next_pos = torch.stack([p.max() for p in prompt_pos]) + 1
    positions[:, response_index[response_real]] = (next_pos[group][:, None] + torch.arange(width))[response_real]
    buckets = length_buckets(extents)
    source = torch.zeros(total, dtype=torch.long)
    source[prompt_index[prompt_real]] = torch.arange(prompt_index.numel()).reshape(prompt_index.shape)[prompt_real]
    offset = prompt_index.numel()
    for rows, bucket_width in buckets:  # each bucket's (B_k, W_k) gathered rows follow the prompts', in order
        index, real = response_index[rows, :bucket_width], response_real[rows, :bucket_width]
        source[index[real]] = offset + torch.arange(index.numel()).reshape(index.shape)[real]
        offset += index.numel()
    # Token 0 is predicted by the prompt's last state, token j > 0 by response token j - 1; a column past the
    # response's extent is never scored and points at the prompt's last state.
    last = (prompt_start + lengths - 1)[group]
    gather = last[:, None].expand(-1, width).clone()
    gather[:, 1:] = torch.where(response_real[:, 1:], response_index[:, :-1], last[:, None])
    layout = PackedLayout(prompt_index=prompt_index, prompt_keys=prompt_real, response_index=response_index,
                          response_keys=response_real & (response_mask > 0), response_group=group, source=source,
                          buckets=buckets)
    out = {"input_ids": input_ids[None], "mm_token_type_ids": mm_types[None],
           "position_ids": family.model_positions(positions[:, None]), "packed_layout": layout,
           "packed_gather": gather}
    for key in MEDIA_FIELDS:
        present = [getattr(p, key) for p in groups.prompts if getattr(p, key) is not None]
        if present:
            out[key] = torch.cat(present)
    return out


def segment_starts(lengths: torch.Tensor, group: torch.Tensor, extents: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each segment of the flat sequence starts: prompt g, then the responses of g in row order, then
    prompt g + 1. lengths (G,), group and extents (B,) -> prompt starts (G,), response starts (B,)."""
    count = len(lengths)
    owner = torch.cat([torch.arange(count), group])  # segment -> its prompt
    order = torch.cat([torch.full((count,), -1), torch.arange(len(group))])  # the prompt first, then row order
    ranked = torch.argsort(owner * (len(group) + 1) + order + 1)
    starts = torch.empty(count + len(group), dtype=torch.long)
    sizes = torch.cat([lengths, extents])[ranked]
    starts[ranked] = torch.cumsum(sizes, 0) - sizes
    return starts[:count], starts[count:]


def response_extents(response_mask: torch.Tensor) -> list[int]:
    """response_mask (B, R) -> each row's extent: the columns up to its last masked-in one (a hole inside it
    counts; 0 for an empty row)."""
    columns = torch.arange(1, response_mask.shape[1] + 1)
    return (columns * (response_mask.cpu() > 0)).amax(1).tolist() if len(response_mask) else []


def packed_lengths(groups: Groups, extents: Sequence[int]) -> list[int]:
    """Each packed row's length: its prompt and the extents of its responses."""
    lengths = [len(p) for p in groups.prompts]
    for g, extent in zip(groups.index, extents):
        lengths[g] += extent
    return lengths


def worth_packing(prompts: Sequence[EncodedPrompt]) -> bool:
    """Whether to score a batch packed: when some prompt repeats and no response holds media.

    The packed forward never costs more than the plain one (rows of prompt + response, padded to the longest):
    its dense layers run sum(prompts) + sum(extents) tokens, not B * (P + R), and its attention G*P^2 + B*R*(P + R)
    pairs, not B * (P + R)^2. Without a repeated prompt it saves only attention's masked pairs, for its gathers,
    so such a batch runs plain. A response holding media (an agent episode's tool images) is never packed: its
    positions are the family's, not consecutive ones.
    """
    if any(p.response_mm_types is not None and bool(p.response_mm_types.any()) for p in prompts):
        return False
    return len(Groups.of(prompts).prompts) < len(prompts)
