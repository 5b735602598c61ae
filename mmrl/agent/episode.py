"""One episode: a prompt, then turns of the policy and of tools, within limits, flagged when a budget cut it.

The response is every turn after the prompt, in order: the policy's sampled tokens (its own, trained on) and
each tool turn's tokens (holes: context, never trained on), image tokens included. :meth:`Episode.context`
is the whole episode so far as one prompt for the next policy turn: the prompt's encoding followed by every
turn's ids, and the prompt's and the tool turns' pixels and grids in order, so the model family computes its
positions and runs its vision tower on it as on any prompt with several images. Each tool turn is encoded
once, when it arrives (:meth:`mmrl.agent.chat.ChatFormat.encode_turn`); nothing of an earlier turn is encoded
again. The n episodes of a prompt hold the prompt's encoding itself, and their contexts read its pixels through
(:class:`~mmrl.agent.context.JoinedPrompt`): no episode copies them.

An episode ends when the policy ends a turn without a tool call (its answer), or is cut (``cut``, one of
:data:`CUT_KINDS`): ``max_turns`` (its last allowed turn called a tool), ``max_tool_calls`` (a turn's calls
would pass the limit), ``max_tokens`` (the next turn, policy or tool, would pass the episode's token budget),
``max_model_len`` (the context would pass the engine's), ``turn_tokens`` (a policy turn reached
``max_new_tokens`` without ending). A cut episode ends cleanly after its last complete turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from mmrl.agent.calls import CallError, ToolCall
from mmrl.agent.context import JoinedPrompt, joined, media_of
from mmrl.agent.outputs import ToolOutput
from mmrl.models.encoding import MEDIA_FIELDS, EncodedPrompt

CUT_KINDS: tuple[str, ...] = ("max_turns", "max_tool_calls", "max_tokens", "max_model_len", "turn_tokens")


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 4
    """Policy turns per episode."""
    max_tool_calls: int = 4
    """Tool calls per episode (malformed ones count: each gets an answer in a tool turn)."""
    max_tokens: int = 1024
    """Response tokens per episode: the policy's and the tools' (image tokens included)."""
    max_new_tokens: int = 64
    """Tokens per policy turn."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tool_calls", "max_tokens", "max_new_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EpisodeLimits.{name} must be a positive integer, got {value!r}")


@dataclass
class Turn:
    """One turn of the response: ids (L,) int64, mm_token_type_ids (L,) int64, and for the policy's its
    log-probs (L,) float32 under the sampling distribution and, with in-flight weight updates, the weights' version
    that drew each token (L,) int64; for a tool turn its encoding (pixels, grids).
    ``trained`` False: a policy turn shown as context only (a demonstration's turn of weight 0)."""

    ids: torch.Tensor
    mm_types: torch.Tensor
    policy: bool
    text: str = ""
    log_probs: torch.Tensor | None = None
    requests: list[ToolCall | CallError] = field(default_factory=list)  # a policy turn's calls, parsed
    encoded: EncodedPrompt | None = None
    trained: bool = True
    versions: torch.Tensor | None = None


@dataclass(frozen=True)
class CallRecord:
    """One call of the episode and what it gave (for rewards, metrics and the rollout's HTML)."""

    turn: int  # the policy turn that made it (0-based)
    call: ToolCall | CallError
    output: ToolOutput


@dataclass(eq=False)
class Episode:
    prompt: EncodedPrompt
    images: list[Image.Image]  # every image of the episode, as stored: the prompt's, then the tools'
    model_image_sizes: list[tuple[int, int]]  # per image, the (width, height) the model saw it at
    turns: list[Turn] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    done: bool = False
    cut: str | None = None
    kept: Any = None  # what the engine kept of the context after the last policy turn (a later turn continues it)

    @property
    def num_policy_turns(self) -> int:
        return sum(t.policy for t in self.turns)

    @property
    def response_tokens(self) -> int:
        return sum(len(t.ids) for t in self.turns)

    @property
    def policy_tokens(self) -> int:
        return sum(len(t.ids) for t in self.turns if t.policy)

    @property
    def final_text(self) -> str:
        """The text of the policy's last turn: its answer, where a single-turn response has it."""
        return next((t.text for t in reversed(self.turns) if t.policy), "")

    def context_length(self) -> int:
        return len(self.prompt) + self.response_tokens

    def add_policy_turn(self, ids: torch.Tensor, log_probs: torch.Tensor, text: str,
                        requests: list[ToolCall | CallError], trained: bool = True,
                        versions: torch.Tensor | None = None) -> None:
        """ids, log_probs (L,): the policy's sampled tokens of one turn (its end-of-turn token included), its
        text and the calls parsed from it; ``trained`` False keeps the turn out of ``policy_mask``; ``versions``
        (L,): each token's weight version (in-flight updates), None when the engine did not record them."""
        assert not self.done and ids.shape == log_probs.shape
        self.turns.append(Turn(ids.long(), torch.zeros_like(ids, dtype=torch.long), True, text, log_probs.float(),
                               list(requests), trained=trained,
                               versions=None if versions is None else versions.long()))

    def add_tool_turn(self, encoded: EncodedPrompt, records: list[CallRecord], model_image_sizes: list[tuple[int, int]]
                      ) -> None:
        """A tool turn (:meth:`mmrl.agent.chat.ChatFormat.encode_turn`) answering ``records``' calls; its images
        join the episode's, seen at ``model_image_sizes``."""
        assert not self.done
        self.turns.append(Turn(encoded.input_ids, encoded.mm_token_type_ids, False, encoded=encoded))
        self.calls.extend(records)
        self.images.extend(encoded.source_images)
        self.model_image_sizes.extend(model_image_sizes)

    def finish(self, cut: str | None = None) -> None:
        assert cut is None or cut in CUT_KINDS
        self.done, self.cut, self.kept = True, cut, None

    def context(self) -> EncodedPrompt:
        """The episode so far as one prompt: ids (P+R,), mm_token_type_ids (P+R,), every image's pixels and grids
        in order (read through from the prompt's encoding and the tool turns', :class:`JoinedPrompt`: the
        episodes of one prompt share its pixels), the ids before media expansion (``template_ids``) and the source
        images (for vLLM)."""
        prompt, tools = self.prompt, [t.encoded for t in self.turns if t.encoded is not None]
        template = list(prompt.template_ids)
        for turn in self.turns:
            template += turn.ids.tolist() if turn.policy else list(turn.encoded.template_ids)
        return JoinedPrompt(
            input_ids=torch.cat([prompt.input_ids, *(t.ids for t in self.turns)]),
            mm_token_type_ids=torch.cat([prompt.mm_token_type_ids, *(t.mm_types for t in self.turns)]),
            media_parts=(prompt, *tools), template_ids=template, name=prompt.name,
            source_images=[*prompt.source_images, *(i for p in tools for i in p.source_images)],
            source_videos=prompt.source_videos,
        )

    def context_from(self, start: int) -> EncodedPrompt:
        """The context's tokens from ``start`` on (T - start,), with the pixels and grids of the tool turns among
        them: what a later turn prefills when the engine kept the context's first ``start`` tokens. ``start``
        lies after the prompt and outside the tool turns (a kept context ends inside a policy turn)."""
        if start < len(self.prompt):
            raise ValueError(f"prompt {self.prompt.name}: a context kept up to token {start} ends inside the prompt")
        offset, tools = len(self.prompt), []
        for turn in self.turns:
            end = offset + len(turn.ids)
            if not turn.policy and offset < start < end:
                raise ValueError(f"prompt {self.prompt.name}: a context kept up to token {start} ends inside a tool turn")
            if not turn.policy and offset >= start:
                tools.append(turn.encoded)
            offset = end
        skip = start - len(self.prompt)  # of the response's tokens
        media = {key: joined(tools, key) for key in MEDIA_FIELDS}
        return EncodedPrompt(input_ids=torch.cat([t.ids for t in self.turns])[skip:],
                             mm_token_type_ids=torch.cat([t.mm_types for t in self.turns])[skip:],
                             **media, name=self.prompt.name)

    def scoring_context(self) -> EncodedPrompt:
        """The prompt for scoring this episode's response (the trainer's passes): the prompt's ids (P,) and
        media types, then every image's pixels and grids in order (the prompt's, then the tool turns'), and the
        response's media token types (``response_mm_types``, (R,)). Prompt + response is then the context
        the policy generated its last turn from, ids, positions and pixels alike. Its media are read through
        (:class:`JoinedPrompt`): its first piece is the prompt's encoding itself, which the n episodes of the
        prompt share on this rank and, pickled together, send once."""
        prompt = self.prompt
        return JoinedPrompt(
            input_ids=prompt.input_ids, mm_token_type_ids=prompt.mm_token_type_ids,
            media_parts=(prompt, *(media_of(t.encoded) for t in self.turns if t.encoded is not None)),
            name=prompt.name, response_mm_types=self.response()["mm_types"],
        )

    def response(self) -> dict[str, torch.Tensor]:
        """The response's (R,) tensors: ids int64, policy_mask float32 (1 on the policy's trained tokens, 0 on
        tools' and on context-only policy turns), log_probs float32 (0 on tools' tokens), mm_types int64 (the tool
        turns' image tokens); with in-flight weight updates also versions int64 (:meth:`versions`)."""
        def cat(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
            return torch.cat(parts).to(dtype) if parts else torch.zeros(0, dtype=dtype)

        out = {
            "ids": cat([t.ids for t in self.turns], torch.long),
            "policy_mask": cat([torch.full((len(t.ids),), float(t.policy and t.trained)) for t in self.turns],
                               torch.float32),
            "log_probs": cat([t.log_probs if t.policy else torch.zeros(len(t.ids)) for t in self.turns], torch.float32),
            "mm_types": cat([t.mm_types for t in self.turns], torch.long),
        }
        versions = self.versions()
        return out if versions is None else out | {"versions": versions}

    def versions(self) -> torch.Tensor | None:
        """(R,) int64: the weight version of each response token, a tool turn's tokens (holes) taking the version of
        the policy token before them, so that the versions never decrease along a response; None when no policy
        turn recorded its versions."""
        known = [t.versions for t in self.turns if t.policy and t.versions is not None and len(t.versions)]
        if not known:
            return None
        last, parts = int(known[0][0]), []
        for turn in self.turns:
            if turn.policy and turn.versions is not None and len(turn.versions):
                parts.append(turn.versions)
                last = int(turn.versions[-1])
            else:
                parts.append(torch.full((len(turn.ids),), last, dtype=torch.long))
        return torch.cat(parts)
