"""Workers with probes for tests and benchmarks: what a rank holds, full copies of its weights, call counts.

The production workers (:mod:`mmrl.workers`) carry none of this; a test or a benchmark builds its
WorkerGroup from these subclasses instead (``RLTrainer.actor_worker`` and its siblings take them too).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch

from mmrl.controller import Dispatch, register
from mmrl.models.families import family_of
from mmrl.parallel.sharding import full_state
from mmrl.workers.critic import CriticWorker
from mmrl.workers.hybrid import ActorRolloutRefWorker
from mmrl.workers.judge import JudgeWorker
from mmrl.workers.rollout_worker import RolloutWorker


class ProbedActor(ActorRolloutRefWorker):
    """The hybrid worker plus probes."""

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, *args: Any, **kwargs: Any) -> int:
        count = super().init_model(*args, **kwargs)
        self.vision_items = 0
        tower = self.vision_tower()

        def counted(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            # Items: the grid's rows where the tower takes grids, else the images (tiles) it is given.
            grid = kwargs["grid_thw"] if "grid_thw" in kwargs else args[1] if len(args) > 1 else None
            items = grid if grid is not None else kwargs["pixel_values"] if "pixel_values" in kwargs else args[0]
            self.vision_items += int(items.shape[0])

        tower.register_forward_pre_hook(counted, with_kwargs=True)
        return count

    def vision_tower(self) -> torch.nn.Module:
        core = self.actor.root.core
        return family_of(core.config).vision(core)

    @register(Dispatch.ONE_TO_ALL)
    def vision_passes(self, reset: bool = True) -> int:
        """Images and videos the actor's vision tower encoded since the last reset (the hf engine that shares
        the actor's module counts too; a sharded tower's dummy input on a text-only micro-batch counts 1)."""
        items = self.vision_items
        if reset:
            self.vision_items = 0
        return items

    @register(Dispatch.ONE_TO_ALL)
    def held_prompts(self) -> list[str]:
        """The uids whose encodings this rank holds."""
        return sorted(self.prompt_cache.by_uid)

    @register(Dispatch.ONE_TO_ALL)
    def versions(self) -> tuple[int, int | None]:
        """(the actor's weight version, the engine's; None when the engine's weights are freed)."""
        return self.version, self.engine_version

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def full_state_dict(self, part: str = "all") -> dict[str, torch.Tensor]:
        """Copies of the full parameters (``part``: all | vision | llm), Hugging Face names."""
        out = {}
        vision = {id(p) for p in self.vision_tower().parameters()}
        ids = [id(p) for p in self.actor.root.parameters()]  # in the order hf_weights yields them
        for (name, tensor), pid in zip(self.hf_weights(), ids):
            is_vision = pid in vision
            if part == "all" or (part == "vision") == is_vision:
                out[name] = tensor.detach().cpu().clone()
        return out

    @register(Dispatch.ONE_TO_ALL)
    def overwrite_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Set the named full tensors (Hugging Face names) of an unsharded actor in place and count it as a new
        weight version, so that the rollout engine is loaded with them before its next rollout."""
        params = dict(zip((name for name, _ in self.hf_weights()), self.actor.root.parameters()))
        with torch.no_grad():
            for name, tensor in state.items():
                if type(params[name].data) is not torch.Tensor:
                    raise NotImplementedError(f"{name} is sharded: overwrite_weights takes an unsharded actor")
                params[name].copy_(tensor)
        self.version += 1

    @register(Dispatch.ONE_TO_ALL)
    def layout_report(self) -> dict[str, object]:
        """What this rank holds: parameter kinds, optimizer-state owners and gradients."""
        tower = self.vision_tower()
        vision_ids = {id(p) for p in tower.parameters()}
        state_owners = [id(p) for p in self.updater.optimizer.state]
        return {
            "sharded": len(self.actor.sharded),
            "replicated": len(self.actor.replicated),
            "vision_params_with_optimizer_state": sum(i in vision_ids for i in state_owners),
            "params_with_optimizer_state": len(state_owners),
            "vision_params_with_grad": sum(p.grad is not None for p in tower.parameters()),
            "rollout_params_held": self.rollout_params_held(),
        }

    def rollout_params_held(self) -> int:
        """Elements an hf rollout engine holds on its own (-1: it shares the actor's module, or is not hf)."""
        from mmrl.rollout.hf import HFRolloutEngine

        if not isinstance(self.rollout, HFRolloutEngine) or not self.rollout.owns_weights:
            return -1
        return sum(p.numel() for p in self.rollout.model.parameters())

    @register(Dispatch.ONE_TO_ALL)
    def time_weight_update(self) -> float:
        """Seconds to gather the actor's weights and load them into the rollout engine."""
        self.engine_version = -1
        start = time.perf_counter()
        self.sync_weights(wake=True)
        return time.perf_counter() - start


class ProbedCritic(CriticWorker):
    @register(Dispatch.ONE_TO_ALL)
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of the full parameters of the value model."""
        return {name: t.detach().cpu().clone() for name, t in full_state(self.layout.root)}


class ProbedJudge(JudgeWorker):
    @register(Dispatch.ONE_TO_ALL)
    def shutdown_engine(self) -> None:
        self.engine.shutdown()

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


ZOOM_TOP_LEFT = ("zoom_in", {"bbox_2d": [0, 0, 28, 28]})


def script_calls(agent: Any, call: tuple[str, dict] = ZOOM_TOP_LEFT) -> None:
    """Decide for a random model when its agent calls a tool: a policy turn whose text has an even number of
    characters makes ``call`` (by default ``zoom_in`` on the top-left quarter of the episode's first image); the
    others answer. (A random tiny model never writes a well-formed call itself.) A turn that writes a call or an
    answer in the trained format (a guide episode's) is parsed as it is. Everything after the decision is the real
    agent loop: the tool's worker process, the tool turn, its encoding, the holes."""
    from mmrl.agent.calls import ToolCall
    from mmrl.answer_format import ANY_TAG

    if agent is None:
        return
    parse = agent.table.parse

    def scripted(text: str) -> list:
        if "<tool_call>" in text or ANY_TAG.search(text):
            return parse(text)
        return [ToolCall(*call)] if len(text) % 2 == 0 else []

    agent.table.parse = scripted


class ScriptedCallsActor(ProbedActor):
    """The probed hybrid worker whose agent's calls are scripted (:func:`script_calls`)."""

    scripted_call: tuple[str, dict] = ZOOM_TOP_LEFT

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, *args: Any, **kwargs: Any) -> int:
        count = super().init_model(*args, **kwargs)
        script_calls(self.agent, self.scripted_call)
        return count

    @register(Dispatch.ONE_TO_ALL)
    def held_contexts(self) -> list[str]:
        """The context keys of the agent samples this rank holds."""
        return sorted(key for key in self.prompt_cache.by_uid if "#" in key)


class DyingEpisodeActor(ScriptedCallsActor):
    """Calls the test tool that returns an image (``tests/fixtures/agent_tools/faulty.py:misbehave``, so that a video
    prompt's episode gets image turns), and on rank 0 kills its own process in the middle of an episode of the
    run's second step (its policy turn done, its tool turn not), once per run: it leaves
    ``<trainer.out_dir>/agent_rank_died`` behind, and the rebuilt group's ranks find it and live."""

    scripted_call = ("misbehave", {"action": "image"})

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, cfg: Any, *args: Any, **kwargs: Any) -> int:
        count = super().init_model(cfg, *args, **kwargs)
        marker = os.path.join(cfg.trainer.out_dir, "agent_rank_died")
        loop = self.agent.loop
        tool_turn = loop._tool_turn

        def dying(episodes: list, stats: Any) -> None:
            if self.rank == 0 and self.version >= 1 and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)
            tool_turn(episodes, stats)

        loop._tool_turn = dying
        return count


class ScriptedCallsRollout(RolloutWorker):
    """A rank of the async mode's rollout pool whose agent's calls are scripted (:func:`script_calls`)."""

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, *args: Any, **kwargs: Any) -> int:
        version = super().init_model(*args, **kwargs)
        script_calls(self.agent)
        return version


class DyingEpisodeRollout(ScriptedCallsRollout):
    """A rank of the async mode's rollout pool whose agent's calls are scripted (``zoom_in``, which returns an image)
    and which, on rank 0, kills its own process in the middle of an episode of a batch drawn with weights of version
    1 or later (at ``max_staleness=0``, step 2's): a policy turn has called the tool and its tool turn has not run.
    Once per run: it first leaves ``<trainer.out_dir>/rollout_died_mid_episode`` behind (JSON: its pid, its weights'
    version, and per unfinished episode its policy turns, tool turns and pending calls), and the rebuilt pool's ranks
    find it and live."""

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, cfg: Any, *args: Any, **kwargs: Any) -> int:
        version = super().init_model(cfg, *args, **kwargs)
        marker = os.path.join(cfg.trainer.out_dir, "rollout_died_mid_episode")
        tool_turn = self.agent.loop._tool_turn

        def dying(episodes: list, stats: Any) -> None:
            pending = [len(e.turns[-1].requests) for e in episodes]
            if self.rank == 0 and self.version >= 1 and any(pending) and not os.path.exists(marker):
                os.makedirs(os.path.dirname(marker), exist_ok=True)
                with open(marker, "w") as f:
                    json.dump({"pid": os.getpid(), "version": self.version, "pending_calls": pending,
                               "policy_turns": [e.num_policy_turns for e in episodes],
                               "tool_turns": [sum(not t.policy for t in e.turns) for e in episodes]}, f)
                os._exit(1)
            tool_turn(episodes, stats)

        self.agent.loop._tool_turn = dying
        return version


class UnreliableRollout(RolloutWorker):
    """A rollout rank of the async mode that holds each batch ``DELAY_S`` longer after drawing it (with the weights
    it pulled at the batch's start): a rollout pool slower than it would be. With ``die_on`` set (a batch number,
    counted from 1 on each rank) the rank kills its own process at that batch, once per run: it leaves
    ``<trainer.out_dir>/rollout_died`` behind, and the rebuilt pool's ranks find it and live."""

    DELAY_S = 0.3
    die_on = 2

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, cfg: Any, checkpoint: str, transport: Any = None) -> int:
        self.batches = 0
        self.marker = os.path.join(cfg.trainer.out_dir, "rollout_died")
        return super().init_model(cfg, checkpoint, transport)

    @register(Dispatch.DP_COMPUTE, fields=("messages", "images"), prompts=True, keep_prompts=False)
    def generate(self, prompts: Any, params: Any) -> Any:
        self.batches += 1
        if self.batches == self.die_on and not os.path.exists(self.marker):
            os.makedirs(os.path.dirname(self.marker), exist_ok=True)
            open(self.marker, "w").close()
            os._exit(1)
        out = super().generate(prompts, params)
        time.sleep(self.DELAY_S)
        return out
