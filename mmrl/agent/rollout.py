"""A rollout rank's agent: its tools, their worker processes and the agent loop on the rank's engine.

A rank that holds a rollout engine builds one :class:`AgentRollout` when ``rollout.agent.enabled``. Its
prompts are encoded with the tools in their system message (:meth:`AgentRollout.messages`, applied by the
rank's prompt cache), its samples are episodes (:meth:`AgentRollout.sample`). Each episode's scoring context
(its prompt with the tool turns' media appended, :meth:`~mmrl.agent.episode.Episode.scoring_context`) stays on
the rank under the sample's ``context_key``: the log-prob, value and update passes find it there, so the tool
images cross no process boundary for training. What goes back to the driver is what rewards and metrics read:
the final answer (``response_text``), the episode's record (``episode``: turns, calls, the tools' texts and
images) and the counts.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from typing import Any

import torch

from mmrl.agent.calls import CallError, ToolCall
from mmrl.agent.chat import ChatFormat
from mmrl.agent.episode import CUT_KINDS, Episode, EpisodeLimits
from mmrl.agent.executor import ToolExecutor
from mmrl.agent.loop import AgentLoop, response_batch
from mmrl.agent.outputs import ToolLimits, ToolOutput
from mmrl.agent.scripted import ScriptedTurns
from mmrl.agent.stats import ToolStats
from mmrl.agent.table import build_tool_table
from mmrl.config import AgentConfig
from mmrl.models.encoding import EncodedPrompt, media_grids
from mmrl.protocol import Batch
from mmrl.rollout.base import RolloutEngine, SamplingParams
from mmrl.rollout.samples import encode_rows


def tool_limits(cfg: AgentConfig) -> ToolLimits:
    default = ToolLimits()
    return ToolLimits(max_text_chars=cfg.max_text_chars, max_images=cfg.max_images, max_pixels=cfg.max_pixels,
                      max_image_pixels=max(default.max_image_pixels, cfg.max_pixels))


def episode_limits(cfg: AgentConfig, max_new_tokens: int) -> EpisodeLimits:
    """``max_new_tokens``: the rollout's, for a turn when ``cfg.max_new_tokens`` is 0."""
    return EpisodeLimits(max_turns=cfg.max_turns, max_tool_calls=cfg.max_tool_calls, max_tokens=cfg.max_tokens,
                         max_new_tokens=cfg.max_new_tokens or max_new_tokens)


def png(image: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def episode_record(episode: Episode) -> dict[str, Any]:
    """What rewards, the judge and the rollout's HTML see of an episode: ``turns`` in order (the policy's:
    role ``assistant`` and its text; a tool turn: role ``tool`` and the indices of the calls it answers),
    ``calls`` (each: the policy turn that made it, the tool's name, its arguments or the malformed call's error
    kind, its output's text, failure kind, images as PNG bytes and repairs), ``cut``, ``final_text`` and
    ``model_image_sizes`` (per image of the episode, the (width, height) the model saw it at)."""
    turns, policy_turn = [], -1
    for turn in episode.turns:
        if turn.policy:
            policy_turn += 1
            turns.append({"role": "assistant", "text": turn.text})
        else:
            turns.append({"role": "tool", "calls": [i for i, r in enumerate(episode.calls) if r.turn == policy_turn]})
    calls = []
    for record in episode.calls:
        call, output = record.call, record.output
        entry = {"turn": record.turn, "name": call.name or None, "text": output.text, "failure": output.failure,
                 "images": [png(i) for i in output.images], "repairs": list(output.repairs)}
        entry |= {"arguments": call.arguments} if isinstance(call, ToolCall) else {"error": call.kind}
        calls.append(entry)
    return {"turns": turns, "calls": calls, "cut": episode.cut, "final_text": episode.final_text,
            "model_image_sizes": [list(size) for size in episode.model_image_sizes]}


class AgentRollout:
    """One rank's agent rollouts (see the module's docstring); its tool workers live as long as the rank."""

    def __init__(self, cfg: AgentConfig, processor: Any, engine: RolloutEngine, max_new_tokens: int,
                 max_model_len: int | None = None) -> None:
        self.cfg = cfg
        self.executor = ToolExecutor(isolation=cfg.isolation, num_workers=cfg.num_workers, timeout_s=cfg.timeout_s,
                                     max_memory_mb=cfg.max_memory_mb)
        self.processor = processor
        self.chat = ChatFormat(processor)
        self.table = build_tool_table(cfg.tools, self.executor, fmt=self.chat.calls)
        self.pad_id = processor.tokenizer.pad_token_id
        self.loop = AgentLoop(engine, self.chat, self.table, self.executor,
                              limits=episode_limits(cfg, max_new_tokens), tool_limits=tool_limits(cfg),
                              max_model_len=max_model_len, kept_bytes=int(cfg.kept_context_gib * 2**30))

    def messages(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """A data row's messages with the tools in the system message (and in the chat template's format)."""
        return self.chat.with_tools(self.chat.in_format(messages), self.table.definitions())

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Episodes for a batch of data rows (their messages given the tools, encoded), as evaluation and SFT's
        validation generate: the samples of :meth:`sample`, without the scoring contexts."""
        with_tools = Batch(tensors=prompts.tensors, meta=prompts.meta, objects={
            **prompts.objects, "messages": [self.messages(m) for m in prompts["messages"]]})
        return self.sample(encode_rows(self.processor, with_tools), params, version=0)[0]

    def sample(self, prompts: Sequence[EncodedPrompt], params: SamplingParams, version: int
               ) -> tuple[Batch, list[EncodedPrompt]]:
        """B encoded prompts -> (B*n samples, the n of prompt i at rows i*n .. i*n+n-1; each sample's scoring
        context, in row order).

        The samples hold responses, response_mask, policy_mask (0 at the tool turns' tokens), each (B*n,
        ``max_tokens``),
        rollout_log_probs, weight_version, prompt_tokens, num_turns and num_tool_calls (B*n,), and as objects
        response_text (the final answer), episode (:func:`episode_record`), image_grids (the prompt's images'),
        vision_grids (its images' and videos') and tool_grids (the tool turns' images', this episode's own). The
        driver's metrics come from these (:func:`agent_metrics`), over every rank's samples.
        """
        episodes, _ = self.loop.run(prompts, params)
        return self.samples(episodes, version), [e.scoring_context() for e in episodes]

    def guide(self, prompts: Sequence[EncodedPrompt], scripts: Sequence[Sequence[str]], version: int
              ) -> tuple[Batch, list[EncodedPrompt]]:
        """One guide episode per encoded prompt, its policy turns ``scripts[i]`` (texts) and its tool turns the
        real tools' outputs (:mod:`mmrl.agent.scripted`): the samples of :meth:`sample` (n=1) with
        ``guide_complete`` (B,) float32, 1 where the episode used its whole script and no budget cut it (a guide
        the step can use), and the scoring contexts."""
        names = [f"{p.name}#guide{i}" for i, p in enumerate(prompts)]  # a prompt may be guided twice in one call
        named = [dataclasses.replace(p, name=name) for p, name in zip(prompts, names)]
        engine = ScriptedTurns(dict(zip(names, scripts)), self.processor.tokenizer)
        loop = AgentLoop(engine, self.chat, self.table, self.executor, limits=self.loop.limits,
                         tool_limits=self.loop.tool_limits, max_model_len=self.loop.max_model_len)
        episodes, _ = loop.run(named, SamplingParams(n=1, max_new_tokens=self.loop.limits.max_new_tokens),
                               new_step=False)
        for episode, prompt in zip(episodes, prompts):
            episode.prompt = prompt  # the prompt's own encoding (only the name differed): its context shares it
        out = self.samples(episodes, version)
        out.tensors["guide_complete"] = torch.tensor(
            [float(e.cut is None and engine.complete(name)) for e, name in zip(episodes, names)])
        return out, [e.scoring_context() for e in episodes]

    def samples(self, episodes: Sequence[Episode], version: int) -> Batch:
        """The samples of finished episodes (see :meth:`sample`)."""
        # One width on every rank and every call (the episode budget), as single-turn rollouts pad to theirs.
        parts = response_batch(episodes, self.pad_id, width=self.loop.limits.max_tokens)
        count = len(episodes)
        grids = [[tuple(int(x) for x in g) for g in e.prompt.image_grid_thw] if e.prompt.image_grid_thw is not None
                 else [] for e in episodes]
        tensors = {key: parts[key] for key in ("responses", "response_mask", "policy_mask", "rollout_log_probs",
                                               "prompt_tokens", "num_turns", "num_tool_calls")}
        tensors["weight_version"] = torch.full((count,), version, dtype=torch.long)
        if "token_versions" in parts:  # in-flight updates: a sample's version is its oldest token's
            tensors["token_versions"] = parts["token_versions"]
            tensors["weight_version"] = parts["token_versions"][:, 0].clone()
        objects = {"response_text": [e.final_text for e in episodes], "episode": [episode_record(e) for e in episodes],
                   "image_grids": grids, "vision_grids": [media_grids(e.prompt) for e in episodes],
                   "tool_grids": [[g for t in e.turns if t.encoded is not None for g in media_grids(t.encoded)]
                                  for e in episodes]}
        return Batch(tensors=tensors, objects=objects)

    def close(self) -> None:
        self.executor.close()


def agent_metrics(samples: Batch, tools: list[str]) -> dict[str, float]:
    """A step's agent metrics from its samples (every rank's): ``agent/turns/mean``,
    ``agent/tool_calls_per_episode/mean``, ``agent/budget_cuts[/<kind>]`` (shares of episodes),
    ``agent/response_tokens/{policy,tool}/mean`` and the tool counts of :meth:`ToolStats.metrics` (calls by
    tool, errors by kind)."""
    records, count = samples["episode"], max(len(samples), 1)
    policy = (samples["policy_mask"] * samples["response_mask"]).sum(1)
    tool = samples["response_mask"].sum(1) - policy
    out = {"agent/turns/mean": float(samples["num_turns"].float().mean()),
           "agent/tool_calls_per_episode/mean": float(samples["num_tool_calls"].float().mean()),
           "agent/budget_cuts": sum(r["cut"] is not None for r in records) / count,
           "agent/response_tokens/policy/mean": float(policy.mean()),
           "agent/response_tokens/tool/mean": float(tool.mean())}
    out |= {f"agent/budget_cuts/{kind}": sum(r["cut"] == kind for r in records) / count for kind in CUT_KINDS}
    stats = ToolStats()
    for call in (c for r in records for c in r["calls"]):
        if "error" in call:
            stats.record_error(CallError(call["error"], call["text"], call["name"] or ""))
        else:
            stats.record(call["name"], ToolOutput(text=call["text"], failure=call["failure"],
                                                  repairs=tuple(call.get("repairs", ()))))
    return out | stats.metrics(tools)
