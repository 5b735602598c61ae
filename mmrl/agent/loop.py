"""The agent loop: episodes for a batch of prompts, each turn generated for every unfinished episode at once.

Per step (:meth:`AgentLoop.run`): the first policy turn samples ``params.n`` episodes per prompt (each prompt
prefilled once for its n samples, as single-turn rollouts are); every later turn generates one continuation
for each unfinished episode, from its whole context (:meth:`~mmrl.agent.episode.Episode.context`), in one
engine call per token allowance (episodes near a budget get fewer new tokens). A turn's calls are read by the
tool table, in the model family's tool-call format (:attr:`~mmrl.agent.chat.ChatFormat.calls`). Between
policy turns, the calls of all episodes run in one batch through the executor (worker processes: a tool failure
is that call's error message), and each episode's outputs become its tool turn, encoded by the model family's
own encoder.

The engine is any :class:`~mmrl.rollout.base.RolloutEngine`; the contexts carry every image's pixels (hf) and
the source images with the ids before media expansion (vLLM). The processor's work on earlier turns is kept
(each tool turn is encoded once). An engine that can continue a context (the hf engine's
``continue_generate``) also keeps the model's: each episode holds its KV cache from one policy turn to the
next (:mod:`mmrl.rollout.kept`), so a later turn prefills only its new tokens and runs the vision tower on the
new images only; within ``kept_bytes`` for the whole batch (the episodes past it prefill their whole context).
vLLM reuses what its prefix cache still holds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

import torch

from mmrl.agent.calls import CallError, ToolCall
from mmrl.agent.chat import ChatFormat
from mmrl.agent.episode import CUT_KINDS, CallRecord, Episode, EpisodeLimits
from mmrl.agent.executor import PendingCall, ToolExecutor
from mmrl.agent.outputs import ToolLimits, ToolOutput
from mmrl.agent.stats import ToolStats
from mmrl.agent.table import ToolTable
from mmrl.agent.worker import ToolInput
from mmrl.models.encoding import EncodedPrompt
from mmrl.rollout.base import RolloutEngine, RolloutOutput, SamplingParams


class AgentLoop:
    """Runs episodes with one engine, one chat format and one table of tools (see the module's docstring)."""

    def __init__(self, engine: RolloutEngine, chat: ChatFormat, table: ToolTable, executor: ToolExecutor, *,
                 limits: EpisodeLimits = EpisodeLimits(), tool_limits: ToolLimits = ToolLimits(),
                 max_model_len: int | None = None, kept_bytes: int = 1 << 30) -> None:
        """``max_model_len``: the longest context (prompt and response); None: the engine's ``max_model_len``.
        ``kept_bytes``: what the unfinished episodes' kept caches may hold in all (0: keep nothing)."""
        if table.fmt is not chat.calls:  # the turns' calls are read by the table (ToolTable.parse), in its format
            raise ValueError(f"{chat.family.name} writes tool calls in the {chat.calls.name} format, but the tool "
                             f"table reads the {table.fmt.name} format; build it with build_tool_table(..., "
                             "fmt=chat.calls)")
        self.engine, self.chat, self.table, self.executor = engine, chat, table, executor
        self.limits, self.tool_limits = limits, tool_limits
        self.kept_bytes = kept_bytes
        self.keeps = kept_bytes > 0 and callable(getattr(engine, "continue_generate", None))
        self.max_model_len = int(max_model_len or getattr(engine, "max_model_len"))
        self.eos_id = chat.processor.tokenizer.eos_token_id

    def run(self, prompts: Sequence[EncodedPrompt], params: SamplingParams, new_step: bool = True
            ) -> tuple[list[Episode], ToolStats]:
        """B encoded prompts (tools already in their system message) -> B*n episodes, the n of prompt i at
        i*n .. i*n+n-1, and the call's tool counts. With ``new_step`` (a step's first call) hung tools are tried
        again; a later call of the same step (its guides) keeps them failed."""
        for prompt in prompts:
            grids = 0 if prompt.image_grid_thw is None else len(prompt.image_grid_thw)
            if grids != len(prompt.source_images):
                raise ValueError(f"prompt {prompt.name}: its {grids} image(s) were not kept (an EncodedPrompt drops its "
                                 "source images when it is sent to another process); run the agent loop where the "
                                 "prompts were encoded, so that tools can crop the stored images")
        if new_step:
            self.executor.begin_step()
        stats = ToolStats()
        episodes = [Episode(p, list(p.source_images), self.chat.model_image_sizes(p)) for p in prompts
                    for _ in range(params.n)]
        self._first_turn(prompts, episodes, params)
        while True:
            self._tool_turn([e for e in episodes if not e.done], stats)
            active = [e for e in episodes if not e.done]
            if not active:
                return episodes, stats
            self._next_turn(active, params)

    # ---- policy turns --------------------------------------------------------------------------

    def _allowance(self, episode: Episode) -> tuple[int, str]:
        """New tokens the episode's next policy turn may have, and the cut a turn that uses them all without
        ending is (the tightest limit's); an episode with no tokens left is cut now (allowance 0)."""
        left = self.limits.max_tokens - episode.response_tokens
        room = self.max_model_len - episode.context_length()
        allowance, cut = min((self.limits.max_new_tokens, "turn_tokens"), (left, "max_tokens"), (room, "max_model_len"),
                             key=lambda pair: pair[0])
        if allowance <= 0:
            episode.finish(cut)
        return max(allowance, 0), cut

    def _first_turn(self, prompts: Sequence[EncodedPrompt], episodes: list[Episode], params: SamplingParams) -> None:
        """All prompts' n samples, in one engine call per allowance (the prompt is prefilled once for its n)."""
        n = params.n
        groups: dict[tuple[int, str], list[int]] = defaultdict(list)
        for i in range(len(prompts)):
            allowances = {self._allowance(e) for e in episodes[i * n:(i + 1) * n]}  # one: the n share their prompt
            allowance = allowances.pop()
            if allowance[0]:
                groups[allowance].append(i)
        for (allowance, cut), indices in groups.items():
            out = self._generate([prompts[i] for i in indices], replace(params, max_new_tokens=allowance))
            self._take([episodes[i * n + j] for i in indices for j in range(n)], out, cut)
        self._bound_kept(episodes)

    def _next_turn(self, active: list[Episode], params: SamplingParams) -> None:
        groups: dict[tuple[int, str], list[Episode]] = defaultdict(list)
        for episode in active:
            allowance = self._allowance(episode)
            if allowance[0]:
                groups[allowance].append(episode)
        for (allowance, cut), group in groups.items():
            turn = replace(params, n=1, max_new_tokens=allowance)
            kept = [e for e in group if e.kept is not None]
            whole = [e for e in group if e.kept is None]
            if kept:
                out = self.engine.continue_generate([e.context() for e in kept],
                                                    [e.context_from(e.kept.length) for e in kept],
                                                    [e.kept for e in kept], turn, keep=True)
                self._take(kept, out, cut)
            if whole:
                self._take(whole, self._generate([e.context() for e in whole], turn), cut)
        self._bound_kept(active)

    def _generate(self, prompts: Sequence[EncodedPrompt], params: SamplingParams) -> RolloutOutput:
        """The engine's turn for ``prompts``, each row's context kept when the loop keeps them."""
        return self.engine.generate(prompts, params, keep=True) if self.keeps else self.engine.generate(prompts, params)

    def _bound_kept(self, episodes: Sequence[Episode]) -> None:
        """Drop the kept caches past ``kept_bytes`` (in episode order): those episodes prefill their next turn whole."""
        held = 0
        for episode in episodes:
            if episode.kept is not None:
                held += episode.kept.nbytes
                if held > self.kept_bytes:
                    episode.kept = None

    def _take(self, episodes: list[Episode], out: RolloutOutput, cut: str) -> None:
        """Each episode's new turn from the engine's output rows (in order), and what it means; ``cut``: what
        a turn that did not end was cut by."""
        lengths = out.response_mask.sum(1).long().tolist()
        kept = out.kept or [None] * len(episodes)
        versions = out.versions if out.versions is not None else [None] * len(episodes)
        for episode, row, logp, text, length, k, drawn in zip(episodes, out.responses, out.log_probs, out.texts,
                                                             lengths, kept, versions):
            ids = row[:length]
            requests = self.table.parse(text)  # in the family's format (checked in __init__)
            episode.add_policy_turn(ids, logp[:length], text, requests,
                                    versions=None if drawn is None else drawn[:length])
            if k is not None and k.length != episode.context_length() - 1:  # all but the unrun end-of-turn token
                raise RuntimeError(f"prompt {episode.prompt.name}: the engine kept {k.length} tokens of a context of "
                                   f"{episode.context_length()}")
            episode.kept = k
            if length == 0 or int(ids[-1]) != self.eos_id:
                episode.finish(cut)
            elif not requests:
                episode.finish()  # its answer
            elif episode.num_policy_turns >= self.limits.max_turns:
                episode.finish("max_turns")

    # ---- tool turns ----------------------------------------------------------------------------

    def _tool_turn(self, episodes: list[Episode], stats: ToolStats) -> None:
        """Run the calls of every episode's last turn in one batch; append each episode's tool turn."""
        planned: list[tuple[Episode, list[ToolCall | CallError]]] = []
        pending: list[PendingCall] = []
        for episode in episodes:
            found = episode.turns[-1].requests
            if len(episode.calls) + len(found) > self.limits.max_tool_calls:
                episode.finish("max_tool_calls")
                continue
            planned.append((episode, found))
            pending += [(c.name, self.table[c.name].spec, self._input(episode, c)) for c in found
                        if isinstance(c, ToolCall)]
        results = iter(self.executor.run(pending) if pending else [])
        for episode, found in planned:
            outputs = [next(results) if isinstance(c, ToolCall) else ToolOutput.failed(c.kind, c.message)
                       for c in found]
            outputs = [self.chat.safe(o) for o in outputs]  # as the model reads it: no special-token strings
            for call, output in zip(found, outputs):
                if isinstance(call, ToolCall):
                    stats.record(call.name, output)
                else:
                    stats.record_error(call)
            encoded = self.chat.encode_turn(outputs, name=episode.prompt.name)
            if episode.response_tokens + len(encoded) > self.limits.max_tokens:
                episode.finish("max_tokens")
            elif episode.context_length() + len(encoded) >= self.max_model_len:
                episode.finish("max_model_len")
            else:
                turn = episode.num_policy_turns - 1
                episode.add_tool_turn(encoded, [CallRecord(turn, c, o) for c, o in zip(found, outputs)],
                                      self.chat.model_image_sizes(encoded))

    def _input(self, episode: Episode, call: ToolCall) -> ToolInput:
        return ToolInput(arguments=call.arguments, images=list(episode.images),
                         model_image_sizes=[list(s) for s in episode.model_image_sizes], limits=self.tool_limits)


def response_batch(episodes: Sequence[Episode], pad_id: int, width: int = 0) -> dict[str, torch.Tensor]:
    """The episodes' responses right-padded to ``width`` (0: the longest): responses (B, R) int64 (pad ``pad_id``),
    response_mask (B, R) (1 on every response token, tools' included), policy_mask (B, R) (1 on the policy's
    tokens only), rollout_log_probs (B, R) (0 at holes), response_mm_types (B, R) (the tool turns' media tokens),
    prompt_tokens (B,), num_turns (B,) (the policy's), num_tool_calls (B,); with in-flight weight updates
    token_versions (B, R) (each row padded with its last version)."""
    parts = [e.response() for e in episodes]
    longest = max([len(p["ids"]) for p in parts] + [1])
    if width and longest > width:
        raise ValueError(f"an episode's response has {longest} tokens, more than the width {width} it is padded to")
    width = width or longest

    def pad(key: str, value: float) -> torch.Tensor:
        return torch.stack([torch.nn.functional.pad(p[key], (0, width - len(p[key])), value=value) for p in parts])

    return {
        "responses": pad("ids", pad_id),
        "response_mask": torch.stack([(torch.arange(width) < len(p["ids"])).float() for p in parts]),
        "policy_mask": pad("policy_mask", 0.0),
        "rollout_log_probs": pad("log_probs", 0.0),
        "response_mm_types": pad("mm_types", 0),
        "prompt_tokens": torch.tensor([len(e.prompt) for e in episodes], dtype=torch.long),
        "num_turns": torch.tensor([e.num_policy_turns for e in episodes], dtype=torch.long),
        "num_tool_calls": torch.tensor([len(e.calls) for e in episodes], dtype=torch.long),
    } | token_versions(parts, width)


def token_versions(parts: Sequence[dict[str, torch.Tensor]], width: int) -> dict[str, torch.Tensor]:
    """``{"token_versions": (B, width) int64}`` of responses whose ``versions`` were recorded, each row padded with its
    last version; {} when none was."""
    if not any("versions" in p for p in parts):
        return {}
    rows = []
    for p in parts:
        versions = p.get("versions", torch.zeros(len(p["ids"]), dtype=torch.long))
        last = int(versions[-1]) if len(versions) else 0
        rows.append(torch.nn.functional.pad(versions, (0, width - len(versions)), value=last))
    return {"token_versions": torch.stack(rows)}


def episode_metrics(episodes: Sequence[Episode], stats: ToolStats, tools: list[str]) -> dict[str, float]:
    """``agent/turns/mean``, ``agent/tool_calls_per_episode/mean``, ``agent/budget_cuts[/<kind>]`` (shares),
    ``agent/response_tokens/{policy,tool}/mean`` and the step's tool counts (:meth:`ToolStats.metrics`)."""
    count = max(len(episodes), 1)
    out = {
        "agent/turns/mean": sum(e.num_policy_turns for e in episodes) / count,
        "agent/tool_calls_per_episode/mean": sum(len(e.calls) for e in episodes) / count,
        "agent/budget_cuts": sum(e.cut is not None for e in episodes) / count,
        "agent/response_tokens/policy/mean": sum(e.policy_tokens for e in episodes) / count,
        "agent/response_tokens/tool/mean": sum(e.response_tokens - e.policy_tokens for e in episodes) / count,
    }
    out |= {f"agent/budget_cuts/{kind}": sum(e.cut == kind for e in episodes) / count for kind in CUT_KINDS}
    return out | stats.metrics(tools)
