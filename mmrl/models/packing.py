"""Prompt sharing: one packed sequence per distinct prompt, holding the prompt once and its k responses after it.

The n samples of a prompt share its media and its prompt tokens. Scored one row per sample, the prompt is
run n times; packed, it runs once::

    row g:  [pad ... pad | prompt g | response 1 (R) | response 2 (R) | ... | response k (R)]

An attention mask lets every response token see the prompt and the earlier tokens of its own response only;
every token keeps the position it has in the unpacked row (the family's, 3-D for some: a response token j
sits at the prompt's largest position + 1 + j). Each response token is therefore computed from exactly the inputs of
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
    width = responses.shape[1]
    sizes = groups.sizes()
    lengths = [len(p) + k * width for p, k in zip(groups.prompts, sizes)]
    total = max(lengths)
    count = len(groups.prompts)
    input_ids = torch.full((count, total), pad_token_id, dtype=torch.long)
    mm_types = torch.zeros((count, total), dtype=torch.long)
    positions = torch.zeros((family.position_axes, count, total), dtype=torch.long)
    segment = torch.full((count, total), -1, dtype=torch.long)  # -1 padding, 0 prompt, i + 1 response slot i
    valid = torch.zeros((count, total), dtype=torch.bool)
    starts = []
    for g, prompt in enumerate(groups.prompts):
        start = total - lengths[g]
        end = start + len(prompt)
        input_ids[g, start:end] = prompt.input_ids
        mm_types[g, start:end] = prompt.mm_token_type_ids
        prompt_pos = prompt_positions(core, prompt)
        positions[:, g, start:end] = prompt_pos
        segment[g, start:end] = 0
        valid[g, start:end] = True
        starts.append((start, end, int(prompt_pos.max()) + 1))
    gather = torch.zeros(responses.shape, dtype=torch.long)
    for row, (g, slot) in enumerate(zip(groups.index, groups.slot)):
        start, end, next_pos = starts[g]
        first = end + slot * width
        input_ids[g, first : first + width] = responses[row]
        positions[:, g, first : first + width] = torch.arange(next_pos, next_pos + width)
        segment[g, first : first + width] = slot + 1
        valid[g, first : first + width] = response_mask[row].bool()
        # Token 0 is predicted by the prompt's last state, token j > 0 by response token j - 1.
        gather[row, 0] = g * total + end - 1
        gather[row, 1:] = g * total + first + torch.arange(width - 1)
    out = {"input_ids": input_ids, "mm_token_type_ids": mm_types, "position_ids": family.model_positions(positions),
           "packed_mask": attention_mask(segment, valid), "packed_gather": gather}
    for key in MEDIA_FIELDS:
        present = [getattr(p, key) for p in groups.prompts if getattr(p, key) is not None]
        if present:
            out[key] = torch.cat(present)
    return out


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


def worth_packing(prompts: Sequence[EncodedPrompt]) -> bool:
    """Packing pays only when some prompt repeats in the micro-batch. A response holding media (an agent
    episode's tool images) is never packed: its positions are the family's, not consecutive ones."""
    if any(p.response_mm_types is not None and bool(p.response_mm_types.any()) for p in prompts):
        return False
    return len({id(p) for p in prompts}) < len(prompts)
