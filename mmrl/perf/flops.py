"""The FLOPs of a step's phases, counted from the model's config and the step's real token and patch counts.

A phase's count is the work its math needs, not what an implementation computes: each distinct prompt (its text
and its images) runs once per pass, however many samples share it, each response token once, and causal attention
counts the (query, key) pairs at or before the query. Padding, a prompt run again per sample, recomputed
activations and dropped rows are not counted, so they show as a lower MFU (:mod:`mmrl.perf.mfu`). Only matrix
products count (2 FLOPs a multiply-add), as in torch's ``FlopCounterMode``; the cost of a forward over T positions
with A (query, key) pairs and logits at K of them is ``dense * T + pair * A + head * K`` (:class:`TextCosts`,
checked against a counted forward in ``tests/unit/test_flops.py``; the vision tower's:
:mod:`mmrl.perf.vision`).

The phases (:func:`phase_flops`):

- ``gen/vision``: the vision tower on each distinct prompt's images and video frames, and on every agent
  episode's tool-returned images (each its episode's own, so once per sample; every pass counts them the same way);
  ``gen/prefill``: each distinct prompt's tokens and its last position's logits, and an agent episode's later
  turns; ``gen/decode``: each sampled token the decode loop feeds back, with its logits.
- ``old_log_prob``, ``ref``: one forward of each group's prompt and responses, logits at the response tokens.
- ``update_actor``: that forward and its backward for every PPO epoch. A backward costs two forwards where weights
  train (the gradients of the inputs and of the weights), one where they are frozen (LoRA's base weights, a frozen
  vision tower: the inputs' gradients only, and none for a tower that has no trainable input before it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mmrl.perf.text import TextCosts, text_costs
from mmrl.perf.vision import Grid, vision_flops


@dataclass(frozen=True)
class GroupWork:
    """One distinct prompt and its samples in a step: ``prompt`` tokens, its images' and videos' patch ``grids``
    ((t, h, w) each), and per sample its response's ``extent`` (the tokens the model attends to) and ``sampled``
    tokens (the policy's; an agent episode's tool tokens are in the extent only), ``turns`` (policy turns) and
    ``tool_grids`` (the grids of the images its tools returned; () when no sample has any)."""

    prompt: int
    grids: tuple[Grid, ...]
    extents: tuple[int, ...]
    sampled: tuple[int, ...]
    turns: tuple[int, ...]
    tool_grids: tuple[tuple[Grid, ...], ...] = ()

    def pairs(self) -> float:
        """Causal (query, key) pairs of a forward over the prompt once and each response after it."""
        p = self.prompt
        return p * (p + 1) / 2 + sum(e * p + e * (e + 1) / 2 for e in self.extents)

    def prompt_pairs(self) -> float:
        return self.prompt * (self.prompt + 1) / 2


def groups_of(uids: Sequence[object], prompt_tokens: torch.Tensor, response_mask: torch.Tensor,
              policy_mask: torch.Tensor, grids: Sequence[Sequence[Grid]], turns: torch.Tensor | None = None,
              tool_grids: Sequence[Sequence[Grid]] | None = None) -> list[GroupWork]:
    """A step's samples as :class:`GroupWork`, one per distinct ``uid`` in first-appearance order.

    prompt_tokens: (B,); response_mask, policy_mask: (B, R); grids: per sample its prompt's image and video
    grids; turns: (B,) policy turns per sample (None: one each); tool_grids: per sample the grids of the images
    its tools returned (None: no tools).
    """
    extents, sampled = response_mask.sum(-1).long().tolist(), policy_mask.sum(-1).long().tolist()
    turn_counts = [1] * len(uids) if turns is None else turns.long().tolist()
    rows: dict[object, list[int]] = {}
    for row, uid in enumerate(uids):
        rows.setdefault(uid, []).append(row)

    def tools(r: list[int]) -> tuple[tuple[Grid, ...], ...]:
        if tool_grids is None or not any(tool_grids[i] for i in r):
            return ()
        return tuple(tuple(tuple(g) for g in tool_grids[i]) for i in r)

    return [GroupWork(prompt=int(prompt_tokens[r[0]]), grids=tuple(tuple(g) for g in grids[r[0]]),
                      extents=tuple(extents[i] for i in r), sampled=tuple(sampled[i] for i in r),
                      turns=tuple(turn_counts[i] for i in r), tool_grids=tools(r)) for r in rows.values()]


def scoring_flops(costs: TextCosts, groups: Sequence[GroupWork], vision: Sequence[float]) -> float:
    """One scoring forward (log-probs of every response token): each group's prompt once, its responses after it,
    logits at the response tokens, and the vision tower (``vision``: each group's tower FLOPs)."""
    text = sum(costs.forward(g.prompt + sum(g.extents), g.pairs(), sum(g.extents)) for g in groups)
    return text + sum(vision)


def update_flops(costs: TextCosts, groups: Sequence[GroupWork], vision: Sequence[float], *, epochs: int,
                 lora: bool, vision_trains: bool) -> float:
    """The update's forward and backward over every sample, ``epochs`` times (see the module's docstring for
    the backward's factors)."""
    positions = sum(g.prompt + sum(g.extents) for g in groups)
    pairs = sum(g.pairs() for g in groups)
    logits = sum(sum(g.extents) for g in groups)
    weights = 2 if lora else 3  # forward + inputs' gradients (+ weights' gradients)
    text = costs.dense * positions * weights + costs.pair * pairs * 3 + costs.head * logits * weights
    tower = sum(vision) * (3 if vision_trains else 1)
    return epochs * (text + tower)


def generation_flops(costs: TextCosts, groups: Sequence[GroupWork], vision: Sequence[float]) -> dict[str, float]:
    """``gen/vision``, ``gen/prefill`` and ``gen/decode`` FLOPs of a rollout that prefills each distinct prompt
    once and decodes its samples from the shared cache.

    A sample's response runs all but its last token: the decode loop feeds back each sampled token but a turn's
    last, and an agent episode's later turns prefill their tool tokens and the last turn's last token. Exact for
    one turn; with several, the attended pairs are shared between the two in proportion to their tokens.
    """
    prefill = sum(costs.forward(g.prompt, g.prompt_pairs(), 1) for g in groups)
    decode = 0.0
    for g in groups:
        for extent, sampled, turns in zip(g.extents, g.sampled, g.turns):
            run = max(extent - 1, 0)  # the response positions the model runs: 0 .. extent - 2
            if run == 0:
                continue
            pairs = run * g.prompt + run * (run + 1) / 2  # position i attends to the prompt and i + 1 tokens
            fed = min(max(sampled - turns, 0), run)
            decode += costs.forward(fed, pairs * fed / run, fed)
            prefill += costs.forward(run - fed, pairs * (run - fed) / run, turns - 1)
    return {"gen/vision": float(sum(vision)), "gen/prefill": prefill, "gen/decode": decode}


def group_vision_flops(config: object, group: GroupWork) -> int:
    """The vision tower's forward FLOPs for one group in one pass: its prompt's items once (the group's samples
    share them), each sample's tool images once per sample."""
    shared = vision_flops(config, group.grids) if group.grids else 0
    return shared + sum(vision_flops(config, grids) for grids in group.tool_grids if grids)


def phase_flops(config: object, groups: Sequence[GroupWork], *, epochs: int = 1, lora: bool = False,
                vision_trains: bool = True) -> dict[str, float]:
    """FLOPs per phase of a step whose samples are ``groups``: ``gen/*`` (and ``gen``, their sum),
    ``old_log_prob`` and ``ref`` (one scoring forward each) and ``update_actor``."""
    costs = text_costs(config)
    vision = [group_vision_flops(config, g) for g in groups]
    gen = generation_flops(costs, groups, vision)
    score = scoring_flops(costs, groups, vision)
    return gen | {"gen": sum(gen.values()), "old_log_prob": score, "ref": score,
                  "update_actor": update_flops(costs, groups, vision, epochs=epochs, lora=lora,
                                               vision_trains=vision_trains)}
