"""Sampling with a shared prefill: each distinct prompt is prefilled once (one vision pass, one pass over its
tokens) and its KV cache is repeated for its n samples, which then decode together.

``transformers.generate`` with n samples per prompt repeats the prompt n times before the prefill, so the
vision tower and the prompt tokens run n times. Here the prefill runs on the distinct prompts only. The
decode loop is a plain one (no logits-processor stack): per step, the policy's distribution
(:func:`~mmrl.models.logprobs.policy_log_softmax`: temperature, vision tokens banned), optional top-k / top-p
truncation for the draw, and one forward of the new tokens with the cache. Positions are the model family's
(:meth:`~mmrl.models.families.base.Family.positions`): a generated token j sits at the prompt's largest
position + 1 + j on every axis. The vision tower runs once per prefill (:func:`~mmrl.models.forward.encode_media`,
the training forward's path), its features handed to the model.

A later turn of an agent episode continues from what the cache held after the episode's previous turn
(:func:`sample_continuation`, :mod:`mmrl.rollout.kept`): only the new tokens and the new images are run.

With in-flight weight updates (:mod:`mmrl.rollout.inflight`) the loop asks for newer weights between tokens; after
a switch the rows' contexts and the tokens drawn so far are prefilled again with the new weights
(:func:`prefill_again`, the training forward's inputs) and each token records the version that drew it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from mmrl.models.encoding import EncodedPrompt, collate
from mmrl.models.families import family_of
from mmrl.models.forward import core_model, encode_media, text_inputs
from mmrl.models.logprobs import policy_log_softmax
from mmrl.perf.clock import PhaseClock
from mmrl.rollout.inflight import InFlightUpdates
from mmrl.rollout.kept import KeptContext, joined, keep_rows, keepable
from mmrl.rollout.reserved import reserve


def truncate(log_probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """log_probs (B, V) -> the same with the tokens outside the top-k and the top-p nucleus at -inf.

    top_k 0 and top_p 1 keep everything. The nucleus is the smallest set of most likely tokens whose
    probability reaches top_p (the most likely token is always kept).
    """
    if top_k > 0 and top_k < log_probs.shape[-1]:
        kth = log_probs.topk(top_k, dim=-1).values[:, -1:]
        log_probs = log_probs.masked_fill(log_probs < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logp, order = log_probs.sort(dim=-1, descending=True)
        before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()  # probability of the tokens ranked above
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        log_probs = log_probs.masked_fill(drop, float("-inf"))
    return log_probs


def draw(log_probs: torch.Tensor, greedy: bool, top_k: int, top_p: float) -> torch.Tensor:
    """log_probs (B, V) -> tokens (B,): the argmax, or a sample from the truncated distribution.

    The sample is the Gumbel-max draw, argmax(log p - log(-log U)) with U uniform: token i wins with probability
    p_i. Uniform draws are many-threaded on CPU, where torch's exponential draws (and ``multinomial``, made of
    them) run on one thread, about 3x slower at 151,936 tokens a row.
    """
    if greedy:
        return log_probs.argmax(-1)
    gumbel = torch.rand_like(log_probs).log_().neg_().log_()  # U = 0 gives +inf: that token never wins
    return (truncate(log_probs, top_k, top_p) - gumbel).argmax(-1)


@dataclass(frozen=True)
class Decoding:
    """How tokens are drawn: at most ``max_new_tokens`` per row, from the policy's distribution at
    ``temperature`` (vision tokens banned; 1 when greedy), truncated by ``top_k`` / ``top_p``; a row stops at
    ``eos_id`` and is padded with ``pad_id`` after it."""

    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    greedy: bool
    banned_ids: Sequence[int]
    eos_id: int
    pad_id: int


class Sampled(NamedTuple):
    """tokens (B, L) int64 (L <= max_new_tokens, the pad id after a row's eos), their log-probs (B, L) float32
    under the policy's distribution, untruncated; when asked for, each row's kept context (None for a row that did
    not end with eos); with in-flight updates, the weights' version that drew each token (B, L) int64."""

    tokens: torch.Tensor
    log_probs: torch.Tensor
    kept: list[KeptContext | None] | None = None
    versions: torch.Tensor | None = None


Rerun = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, Any, torch.Tensor]]
"""(tokens drawn so far (B, s), their attention (B, s)) -> the next token's logits (B, V), the new cache, and the
attention (B, W + s) over the cache's columns: the rows' contexts run again with the model's current weights."""


@torch.no_grad()
def sample_shared_prefill(
    model: torch.nn.Module,
    prompts: Sequence[EncodedPrompt],
    n: int,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    greedy: bool,
    banned_ids: Sequence[int],
    eos_id: int,
    pad_id: int,
    device: torch.device,
    keep: bool = False,
    updates: InFlightUpdates | None = None,
    clock: PhaseClock | None = None,
) -> Sampled:
    """n samples for each of the G distinct ``prompts`` (rows grouped by prompt): tokens and log-probs
    (G*n, L) (see :class:`Sampled`); with ``keep``, each row's context as the cache holds it after the turn
    (:mod:`mmrl.rollout.kept`), for a later turn of the same episode; with ``updates``, newer weights are loaded
    between tokens (:mod:`mmrl.rollout.inflight`). ``clock`` gets the seconds of ``vision``, ``prefill`` and
    ``decode``.
    """
    clock = clock or PhaseClock()
    core = core_model(model)
    family = family_of(core.config)
    inputs = {k: v.to(device) for k, v in collate(prompts, pad_id, share_media=True).items()}
    positions = family.positions(core, inputs)  # (A, G, P)
    with clock("vision"):
        media, _ = encode_media(core, inputs, always=False)
    with clock("prefill"):
        out = model(**text_inputs(inputs), mm_encoder_outputs=media or None,
                    position_ids=family.model_positions(positions), use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    cache.batch_repeat_interleave(n)
    logits = out.logits[:, -1].repeat_interleave(n, dim=0)
    attention = inputs["attention_mask"].repeat_interleave(n, dim=0)
    next_position = (positions.amax(dim=(0, 2)) + 1).repeat_interleave(n)  # (G*n,)
    decoding = Decoding(max_new_tokens, temperature, top_p, top_k, greedy, banned_ids, eos_id, pad_id)
    rows = [p for p in prompts for _ in range(n)]
    with clock("decode"):
        return decode(model, family.position_axes, family.model_positions, cache, logits, attention, next_position,
                      decoding, keep, updates, prefill_again(model, rows, pad_id, device))


@torch.no_grad()
def sample_continuation(
    model: torch.nn.Module,
    contexts: Sequence[EncodedPrompt],
    suffixes: Sequence[EncodedPrompt],
    kept: Sequence[KeptContext],
    decoding: Decoding,
    device: torch.device,
    keep: bool = False,
    updates: InFlightUpdates | None = None,
    clock: PhaseClock | None = None,
) -> Sampled:
    """One sample for each of B contexts whose first ``kept[i].length`` tokens the model has run already.

    contexts: the whole contexts (for their positions); suffixes: each context's tokens after its kept part,
    with the media of those tokens only (the suffix's images go through the vision tower, nothing else does).
    The suffixes are left-padded after the kept rows (the padding is masked); returns as
    :func:`sample_shared_prefill` does (``clock`` as there).
    """
    clock = clock or PhaseClock()
    core = core_model(model)
    family = family_of(core.config)
    cache, kept_attention = joined(kept, device)
    inputs = {k: v.to(device) for k, v in collate(suffixes, decoding.pad_id).items()}
    width = inputs["input_ids"].shape[1]
    positions = torch.zeros((family.position_axes, len(contexts), width), dtype=torch.long)
    next_position = torch.zeros(len(contexts), dtype=torch.long)
    for row, (context, suffix, k) in enumerate(zip(contexts, suffixes, kept)):
        if len(context) != k.length + len(suffix):
            raise ValueError(f"prompt {context.name}: {len(context)} context tokens, but {k.length} kept and "
                             f"{len(suffix)} in the suffix")
        whole = family.prompt_positions(core, context)  # (A, T)
        positions[:, row, width - len(suffix):] = whole[:, k.length:]
        next_position[row] = whole.max() + 1
    positions, next_position = positions.to(device), next_position.to(device)
    attention = torch.cat([kept_attention, inputs["attention_mask"]], dim=1)
    with clock("vision"):
        media, _ = encode_media(core, inputs, always=False)
    with clock("prefill"):
        out = model(**(text_inputs(inputs) | {"attention_mask": attention}), mm_encoder_outputs=media or None,
                    position_ids=family.model_positions(positions), past_key_values=cache, use_cache=True,
                    logits_to_keep=1)
    with clock("decode"):
        return decode(model, family.position_axes, family.model_positions, out.past_key_values, out.logits[:, -1],
                      attention, next_position, decoding, keep, updates,
                      prefill_again(model, contexts, decoding.pad_id, device))


def prefill_again(model: torch.nn.Module, rows: Sequence[EncodedPrompt], pad_id: int, device: torch.device) -> Rerun:
    """The :data:`Rerun` of B rows whose contexts are ``rows`` (a prompt object repeated for its samples has its
    pixels sent and encoded once): the contexts and the tokens drawn so far, collated as the training forward
    collates a prompt and its response, in one forward with the model's current weights."""
    core = core_model(model)
    family = family_of(core.config)

    def rerun(tokens: torch.Tensor, drawn: torch.Tensor) -> tuple[torch.Tensor, Any, torch.Tensor]:
        inputs = {k: v.to(device) for k, v in collate(rows, pad_id, tokens.cpu(), drawn.cpu(),
                                                       share_media=True).items()}
        positions = family.positions(core, inputs)
        media, _ = encode_media(core, inputs, always=False)
        out = model(**text_inputs(inputs), mm_encoder_outputs=media or None,
                    position_ids=family.model_positions(positions), use_cache=True, logits_to_keep=1)
        return out.logits[:, -1], out.past_key_values, inputs["attention_mask"]

    return rerun


def decode(model: torch.nn.Module, axes: int, model_positions: Callable[[torch.Tensor], torch.Tensor], cache: Any,
           logits: torch.Tensor, attention: torch.Tensor, next_position: torch.Tensor, decoding: Decoding,
           keep: bool, updates: InFlightUpdates | None = None, rerun: Rerun | None = None) -> Sampled:
    """The decode loop after a prefill: logits (B, V) of each row's next token, attention (B, W) over the
    cache's W columns, next_position (B,) the position of each row's first new token (the same on all
    ``axes``). Each step draws a token per row and runs the unfinished rows' tokens with the cache. With
    ``updates``, every ``updates.every`` tokens it polls for newer weights; after a switch ``rerun`` prefills the
    contexts and the tokens drawn so far with them, in place of the step's one-token forward.

    Rows that ended leave the batch (:class:`LiveRows`) once a quarter of it has ended, so a long tail of
    responses decodes at the width of the rows still drawing, not at the batch's.
    """
    finished = torch.zeros(len(logits), dtype=torch.bool, device=logits.device)
    batch = LiveRows(cache, logits, attention, next_position, keep, decoding.max_new_tokens)
    tokens, log_probs, versions, drawn = [], [], [], []
    for step in range(decoding.max_new_tokens):
        token, logp = batch.draw(decoding, finished)
        tokens.append(token)
        log_probs.append(logp)
        if updates is not None:
            versions.append(updates.version())
        finished |= token == decoding.eos_id
        drawn.append((~finished).long())
        if bool(finished.all()) or step == decoding.max_new_tokens - 1:
            break
        if updates is not None and rerun is not None and (step + 1) % updates.every == 0 and updates.poll():
            batch.restart(*rerun(torch.stack(tokens, dim=1), torch.stack(drawn, dim=1)), len(tokens))
            continue
        batch.drop_ended(finished, tokens, decoding.eos_id)
        batch.step(model, axes, model_positions, token, drawn[-1], step)
    out = torch.stack(tokens, dim=1)
    kept = batch.kept(out, decoding.eos_id) if keep else None
    drawn_by = torch.tensor(versions, dtype=torch.long).expand(len(out), -1).clone() if updates is not None else None
    return Sampled(out.cpu(), torch.stack(log_probs, dim=1).float().cpu(), kept, drawn_by)


class LiveRows:
    """The rows of a decode batch the cache still holds: ``rows`` (L,) their indices in the batch of B, with
    their logits (L, V), attention (L, W) over the cache's W columns (the first ``prefix`` are the contexts', one
    per decoded step after them) and next_position (L,) of the first new token.

    With ``keep``, a row that leaves the batch hands over its context (:func:`~mmrl.rollout.kept.keep_rows`) as
    it goes; after a weight switch the contexts handed over before it are given up (they hold older weights' keys,
    so the row's next turn is prefilled whole).
    """

    def __init__(self, cache: Any, logits: torch.Tensor, attention: torch.Tensor, next_position: torch.Tensor,
                 keep: bool, room: int) -> None:
        self.cache, self.logits, self.attention, self.next_position = cache, logits, attention, next_position
        self.room = room  # tokens still to run: the cache reserves room for them (mmrl.rollout.reserved)
        reserve(cache, room)
        self.rows = torch.arange(len(logits), device=logits.device)
        self.prefix = attention.shape[1]
        self.keep = keep and keepable(cache)
        self.handed: dict[int, KeptContext | None] = {}

    def draw(self, decoding: Decoding, finished: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A token per row of the batch (B,) and its log-prob (B,); the rows that left get the pad id and 0."""
        scale = 1.0 if decoding.greedy else decoding.temperature
        logp = policy_log_softmax(self.logits, decoding.banned_ids, scale)
        live = draw(logp, decoding.greedy, decoding.top_k, decoding.top_p)
        token = torch.full_like(finished, decoding.pad_id, dtype=torch.long).index_copy(0, self.rows, live)
        chosen = logp.gather(-1, live[:, None]).squeeze(-1)
        token_logp = torch.zeros(len(finished), dtype=chosen.dtype, device=chosen.device).index_copy(0, self.rows, chosen)
        return token.masked_fill(finished, decoding.pad_id), token_logp.masked_fill(finished, 0.0)

    def step(self, model: torch.nn.Module, axes: int, model_positions: Callable[[torch.Tensor], torch.Tensor],
             token: torch.Tensor, running: torch.Tensor, step: int) -> None:
        """Run the live rows' tokens of this step (token (B,), running (B,) 1 where the row goes on) with the
        cache."""
        self.attention = torch.cat([self.attention, running[self.rows, None]], dim=1)
        position = (self.next_position + step).view(1, -1, 1).expand(axes, -1, -1)
        self.logits = model(input_ids=token[self.rows, None], attention_mask=self.attention,
                            position_ids=model_positions(position), past_key_values=self.cache,
                            use_cache=True).logits[:, -1]

    def drop_ended(self, finished: torch.Tensor, tokens: list[torch.Tensor], eos_id: int) -> None:
        """Let the rows that ended go once they are a quarter of the live ones (each drop copies the cache)."""
        ended = finished[self.rows]
        if int(ended.sum()) < max(1, len(self.rows) // 4):
            return
        if self.keep:
            gone = self._contexts(torch.stack(tokens, dim=1), eos_id, ended)
            self.handed.update({int(self.rows[i]): k for i, k in enumerate(gone) if bool(ended[i])})
        stay = (~ended).nonzero().squeeze(-1)
        self._select(stay)

    def restart(self, logits: torch.Tensor, cache: Any, attention: torch.Tensor, drawn: int) -> None:
        """After a weight switch: the rerun's logits (B, V), cache and attention (B, W' + drawn) of the whole
        batch, narrowed to the live rows; the contexts handed over before it are given up."""
        self.cache, self.logits, self.attention = cache, logits[self.rows], attention[self.rows]
        reserve(cache, self.room - drawn)
        self.cache.reorder_cache(self.rows)
        self.prefix = attention.shape[1] - drawn
        self.handed = dict.fromkeys(self.handed)
        self.keep = self.keep and keepable(cache)

    def kept(self, tokens: torch.Tensor, eos_id: int) -> list[KeptContext | None] | None:
        """Each row's context after the turn (tokens (B, L) the turn's draws), None for a row that did not end."""
        if not self.keep:
            return None
        out: list[KeptContext | None] = [None] * len(tokens)
        for row, k in self.handed.items():
            out[row] = k
        ended = (tokens[self.rows] == eos_id).any(-1)
        for i, k in enumerate(self._contexts(tokens, eos_id, ended)):
            out[int(self.rows[i])] = k
        return out

    def _contexts(self, tokens: torch.Tensor, eos_id: int, which: torch.Tensor) -> list[KeptContext | None]:
        """The live rows' contexts as the cache holds them (None where ``which`` (L,) is False): a row that ended
        keeps its context and its turn up to the end-of-turn token, which was never run."""
        ended = tokens[self.rows] == eos_id
        ends = [self.prefix + int(row.nonzero()[0]) if bool(w) and bool(row.any()) else None
                for row, w in zip(ended, which)]
        return keep_rows(self.cache, self.attention, ends)

    def _select(self, index: torch.Tensor) -> None:
        """Keep the live rows at ``index`` (positions among the live rows) in the cache and in each row's state."""
        self.cache.reorder_cache(index)  # an index_select on the batch dimension of every kind of layer
        self.logits, self.attention = self.logits[index], self.attention[index]
        self.rows, self.next_position = self.rows[index], self.next_position[index]
