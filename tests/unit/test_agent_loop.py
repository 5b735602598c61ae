"""The agent loop on the hf engine with the tiny model: episodes batched per turn, tool turns with images as
holes in the policy mask, every limit cutting an episode cleanly, and log-probs that a training forward over
the whole episode reproduces.

The tiny model is random, so two things decide for it here: the table's ``parse`` (a subclass in this test)
reads a zoom call into every turn, and the weight row of the end-of-turn token sets how soon a turn ends
(every first token: turns of one token, so that limits are exact; half the time: real multi-token turns;
never: turns that run out of tokens). Everything else is the real engine, tool, chat format and encoder.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmrl.agent.calls import CallError, ToolCall
from mmrl.agent.chat import ChatFormat
from mmrl.agent.episode import Episode, EpisodeLimits
from mmrl.agent.executor import ToolExecutor
from mmrl.agent.loop import AgentLoop, episode_metrics, response_batch
from mmrl.agent.outputs import ToolLimits
from mmrl.agent.table import ToolTable, build_tool_table
from mmrl.agent.worker import ToolInput
from mmrl.models.encoding import collate, encode_prompt, vision_token_ids
from mmrl.models.forward import PolicyForward
from mmrl.models.loading import load_model, load_processor
from mmrl.models.logprobs import response_logprobs
from mmrl.models.scoring import Scoring
from mmrl.rollout.base import SamplingParams
from mmrl.rollout.hf import HFRolloutEngine
from mmrl.rollout.inflight import InFlightUpdates

CPU = torch.device("cpu")
ZOOM = ToolCall("zoom_in", {"bbox_2d": [0, 0, 28, 28]})
TOOL_LIMITS = ToolLimits(max_pixels=56 * 56)


class ScriptedCalls(ToolTable):
    """The table, but every turn of the policy holds ``calls`` (the random model's decision, made for it)."""

    calls: list[ToolCall | CallError] = [ZOOM]

    def parse(self, text: str) -> list[ToolCall | CallError]:
        return list(self.calls)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def parts(tiny_model_dir: Path) -> Iterator[tuple]:
    processor = load_processor(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir)).eval()
    with ToolExecutor(isolation="inline", timeout_s=10.0) as executor:
        real = build_tool_table(["zoom_in", "calculator"], executor)
        yield model, processor, ChatFormat(processor), ScriptedCalls(list(real)), executor


def prompts(processor) -> list:
    return [encode_prompt(processor, [{"role": "user", "content": "<image>What colour is the circle in A1?"}],
                          [Image.new("RGB", (224, 224), (200, 40, 40))], name="p0"),
            encode_prompt(processor, [{"role": "user", "content": "<image><image>Which is red?"}],
                          [Image.new("RGB", (112, 112), (40, 40, 200)), Image.new("RGB", (56, 112), (200, 40, 40))],
                          name="p1")]


def set_end_of_turn(model, processor, scale: float) -> None:
    """Point the end-of-turn token's head row along the model's typical final state, ``scale`` long."""
    inputs = collate(prompts(processor)[:1], processor.tokenizer.pad_token_id)
    with torch.no_grad():
        states = model(**inputs, output_hidden_states=True).hidden_states[-1][0]
        direction = states.mean(0) / states.mean(0).norm()
        model.lm_head.weight[processor.tokenizer.eos_token_id] = scale * direction


def loop(parts, limits: EpisodeLimits, max_model_len: int | None = None, calls: list | None = None,
         kept_bytes: int = 1 << 30) -> AgentLoop:
    model, processor, chat, table, executor = parts
    table.calls = [ZOOM] if calls is None else calls
    engine = HFRolloutEngine(model, processor, CPU, micro_batch_size=8)
    return AgentLoop(engine, chat, table, executor, limits=limits, tool_limits=TOOL_LIMITS, max_model_len=max_model_len,
                     kept_bytes=kept_bytes)


def test_episodes_log_probs_equal_a_training_forward_over_the_whole_episode(parts) -> None:
    model, processor, chat, table, _ = parts
    set_end_of_turn(model, processor, 1.0)  # a turn ends about half the time: turns of several tokens
    torch.manual_seed(0)
    limits = EpisodeLimits(max_turns=3, max_tool_calls=4, max_tokens=600, max_new_tokens=12)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=12)
    episodes, stats = loop(parts, limits).run(prompts(processor), params)
    assert len(episodes) == 4 and [e.prompt.name for e in episodes] == ["p0", "p0", "p1", "p1"]
    assert all(e.done for e in episodes) and any(len(e.turns) >= 3 for e in episodes)
    assert stats.calls["zoom_in"] == sum(len(e.calls) for e in episodes) > 0
    policy = PolicyForward(model)
    scoring = Scoring(1.0, tuple(vision_token_ids(processor)), False, 0)
    for episode in episodes:
        response = episode.response()
        # Turns alternate, the policy's first; a tool turn's image tokens are media, never the policy's.
        assert [t.policy for t in episode.turns] == [i % 2 == 0 for i in range(len(episode.turns))]
        assert torch.equal(response["policy_mask"] > 0, torch.cat([torch.full((len(t.ids),), t.policy)
                                                                   for t in episode.turns]))
        assert not bool(((response["mm_types"] > 0) & (response["policy_mask"] > 0)).any())
        context = episode.context()
        tool_turns = sum(not t.policy for t in episode.turns)
        images = 1 + (episode.prompt.name == "p1") + tool_turns
        assert context.image_grid_thw.shape[0] == images == len(episode.images) == len(episode.model_image_sizes)
        if tool_turns:
            assert episode.model_image_sizes[-1] == (56, 56)  # a zoom, within the tools' budget of 56 x 56
        # The training forward: the whole episode as one sequence, the policy's tokens scored.
        inputs = collate([context], processor.tokenizer.pad_token_id, share_media=True)
        scored = (response["policy_mask"] > 0)[None]
        with torch.no_grad():
            logp, _ = policy(inputs, response["ids"][None], scored, scoring)
        at = response["policy_mask"] > 0
        assert torch.allclose(logp[0][at], response["log_probs"][at], atol=1e-4), episode.prompt.name


def test_the_trainer_s_batched_scoring_of_episodes_gives_the_rollout_s_log_probs(parts) -> None:
    """The worker's path: a ragged batch of episodes (response_batch) scored against their scoring contexts
    (the prompt plus the tool turns' media) by response_logprobs, unpacked and with prompt sharing asked for."""
    model, processor, _, _, _ = parts
    set_end_of_turn(model, processor, 1.0)
    torch.manual_seed(1)
    limits = EpisodeLimits(max_turns=3, max_tool_calls=4, max_tokens=600, max_new_tokens=12)
    episodes, _ = loop(parts, limits).run(prompts(processor), SamplingParams(n=2, temperature=1.0, max_new_tokens=12))
    assert any(not t.policy for e in episodes for t in e.turns)  # tool turns with images in some responses
    batch = response_batch(episodes, processor.tokenizer.pad_token_id)
    contexts = [e.scoring_context() for e in episodes]
    for episode, context in zip(episodes, contexts):  # prompt + response is the episode's whole context
        whole = episode.context()
        assert torch.equal(torch.cat([context.input_ids, episode.response()["ids"]]), whole.input_ids)
        assert torch.equal(torch.cat([context.mm_token_type_ids, context.response_mm_types]), whole.mm_token_type_ids)
        assert torch.equal(context.image_grid_thw, whole.image_grid_thw)
    for share in (False, True):
        with torch.no_grad():
            logp, _ = response_logprobs(
                PolicyForward(model), contexts, batch["responses"], batch["response_mask"],
                pad_token_id=processor.tokenizer.pad_token_id, banned_ids=vision_token_ids(processor),
                temperature=1.0, device=CPU, share_prompt=share, policy_mask=batch["policy_mask"])
        at = batch["policy_mask"] > 0
        assert torch.allclose(logp[at], batch["rollout_log_probs"][at], atol=1e-4), share
        assert bool((logp[~at] == 0).all())


def run_scripted(parts, limits: EpisodeLimits, scale: float = 6.0, **kwargs) -> list[Episode]:
    model, processor = parts[0], parts[1]
    set_end_of_turn(model, processor, scale)  # 6: every turn is its end-of-turn token alone; -6: never ends
    episodes, _ = loop(parts, limits, **kwargs).run(prompts(processor)[:1], SamplingParams(n=2, greedy=True,
                                                                                          max_new_tokens=4))
    return episodes


def tool_turn_length(parts) -> int:
    """Tokens of a tool turn answering one zoom on the first prompt's image."""
    _, processor, chat, table, executor = parts
    image = prompts(processor)[0].source_images[0]
    inp = ToolInput(arguments=ZOOM.arguments, images=[image], model_image_sizes=[[112, 112]], limits=TOOL_LIMITS)
    return len(chat.encode_turn(executor.run([("zoom_in", table["zoom_in"].spec, inp)])))


def test_the_last_allowed_turn_ends_the_episode(parts) -> None:
    episodes = run_scripted(parts, EpisodeLimits(max_turns=3, max_tool_calls=10, max_new_tokens=4))
    for episode in episodes:
        assert [t.policy for t in episode.turns] == [True, False, True, False, True]
        assert all(len(t.ids) == 1 for t in episode.turns if t.policy)  # the end-of-turn token alone
        assert episode.cut == "max_turns" and len(episode.calls) == 2


def test_budget_limits_cut_cleanly_after_the_last_complete_turn(parts) -> None:
    tool = tool_turn_length(parts)
    prompt = len(prompts(parts[1])[0])
    cases = {
        # tokens: two policy turns of 1 and one tool turn fit, the second tool turn does not
        "max_tokens": (dict(limits=EpisodeLimits(max_turns=5, max_tool_calls=10, max_tokens=2 + 2 * tool - 1,
                                                 max_new_tokens=4)), 3),
        "max_tool_calls": (dict(limits=EpisodeLimits(max_turns=5, max_tool_calls=3, max_new_tokens=4),
                                calls=[ZOOM, ZOOM]), 3),
        "max_model_len": (dict(limits=EpisodeLimits(max_turns=5, max_new_tokens=4),
                               max_model_len=prompt + 2 + tool + 1), 3),
    }
    for cut, (kwargs, num_turns) in cases.items():
        for episode in run_scripted(parts, **kwargs):
            assert episode.cut == cut and len(episode.turns) == num_turns, cut
            assert episode.turns[-1].policy  # it ends after the policy's turn whose calls were not answered
            assert episode.response_tokens <= kwargs["limits"].max_tokens
            assert episode.context_length() <= kwargs.get("max_model_len", 2048)
    never = run_scripted(parts, EpisodeLimits(max_turns=5, max_new_tokens=4), scale=-6.0)
    assert [(e.cut, len(e.turns), len(e.turns[0].ids)) for e in never] == [("turn_tokens", 1, 4)] * 2


def test_malformed_calls_are_answered_and_counted(parts) -> None:
    bad = CallError("bad_json", "the tool call is not valid JSON")
    model, processor = parts[0], parts[1]
    set_end_of_turn(model, processor, 6.0)
    episodes, stats = loop(parts, EpisodeLimits(max_turns=2, max_tool_calls=4, max_new_tokens=4),
                           calls=[bad, ZOOM]).run(prompts(processor)[:1], SamplingParams(n=1, greedy=True))
    [episode] = episodes
    assert [r.output.failure for r in episode.calls] == ["bad_json", None]
    assert "Error: the tool call is not valid JSON" in processor.tokenizer.decode(episode.turns[1].ids)
    assert stats.call_errors == {"bad_json": 1} and stats.calls == {"zoom_in": 1}
    metrics = episode_metrics(episodes, stats, ["zoom_in", "calculator"])
    assert metrics["agent/tool_errors/bad_json"] == 1 and metrics["agent/tool_calls/zoom_in"] == 1
    assert metrics["agent/turns/mean"] == 2 and metrics["agent/budget_cuts/max_turns"] == 1.0
    assert metrics["agent/response_tokens/tool/mean"] == len(episode.turns[1].ids)


def test_response_batch_pads_episodes_with_holes(parts) -> None:
    episodes = run_scripted(parts, EpisodeLimits(max_turns=2, max_new_tokens=4))
    episodes[1].turns = episodes[1].turns[:1]  # a shorter episode: one policy turn
    batch = response_batch(episodes, pad_id=parts[1].tokenizer.pad_token_id)
    tool = tool_turn_length(parts)
    assert len(episodes[0].turns[1].ids) == tool
    width = 2 + tool
    assert batch["responses"].shape == (2, width)
    assert batch["response_mask"].tolist() == [[1.0] * width, [1.0] + [0.0] * (width - 1)]
    assert batch["policy_mask"][0].tolist() == [1.0] + [0.0] * tool + [1.0]
    assert batch["policy_mask"][1].tolist() == [1.0] + [0.0] * (width - 1)
    assert int(batch["response_mm_types"][0].sum()) == int(episodes[0].turns[1].mm_types.sum()) > 0
    assert batch["num_turns"].tolist() == [2, 1] and batch["num_tool_calls"].tolist() == [1, 1]
    assert batch["prompt_tokens"].tolist() == [len(episodes[0].prompt)] * 2


def test_prompts_sent_from_another_process_are_refused(parts) -> None:
    shipped = pickle.loads(pickle.dumps(prompts(parts[1])[0]))  # its source images stay behind
    with pytest.raises(ValueError, match="run the agent loop where the prompts were encoded"):
        loop(parts, EpisodeLimits()).run([shipped], SamplingParams(n=1))


def test_a_later_turn_continues_the_kept_cache_and_runs_only_its_new_tokens_and_images(parts) -> None:
    """The same greedy episodes, token for token, with the cache kept between turns and without (nothing kept,
    or a byte budget that keeps nothing); kept, the vision tower sees each image once and the language model each
    context token once, where without it every later turn runs the whole context again."""
    model, processor = parts[0], parts[1]
    set_end_of_turn(model, processor, 1.0)  # turns of several tokens, some ending, some cut
    seen = {"images": 0, "tokens": 0}

    def count_images(module, args, kwargs) -> None:
        seen["images"] += int(kwargs["grid_thw"].shape[0])

    def count_tokens(module, args) -> None:
        seen["tokens"] += int(args[0].numel())

    core = model.model
    hooks = [core.visual.register_forward_pre_hook(count_images, with_kwargs=True),
             core.language_model.embed_tokens.register_forward_pre_hook(count_tokens)]
    limits = EpisodeLimits(max_turns=3, max_tool_calls=4, max_tokens=600, max_new_tokens=6)
    runs = {}
    try:
        for kept_bytes in (0, 1, 1 << 30):
            seen.update(images=0, tokens=0)
            episodes, _ = loop(parts, limits, kept_bytes=kept_bytes).run(
                prompts(processor), SamplingParams(n=2, greedy=True, max_new_tokens=6))
            runs[kept_bytes] = episodes, dict(seen)
    finally:
        for hook in hooks:
            hook.remove()
    (whole, whole_seen), (unkept, unkept_seen), (kept, kept_seen) = runs[0], runs[1], runs[1 << 30]
    later_turns = sum(e.num_policy_turns - 1 for e in kept)
    assert later_turns > 0 and all(e.kept is None for e in kept)
    for a, b in zip(whole, kept):
        assert [t.text for t in a.turns] == [t.text for t in b.turns]
        ra, rb = a.response(), b.response()
        assert torch.equal(ra["ids"], rb["ids"]) and torch.allclose(ra["log_probs"], rb["log_probs"], atol=1e-5)
    assert unkept_seen == whole_seen  # a budget of 1 byte keeps nothing
    # Kept: each image once (the prompts' 1 and 2 on the first turn, prefilled once for their n), every tool image once.
    assert kept_seen["images"] == 1 + 2 + sum(len(e.calls) for e in kept)
    assert whole_seen["images"] > kept_seen["images"]
    assert whole_seen["tokens"] > kept_seen["tokens"]


def test_episodes_switched_to_new_weights_mid_turn_score_each_token_by_the_version_that_drew_it(parts) -> None:
    """In-flight weight updates inside episodes (rollout.partial): new weights loaded at the engine's 5th poll (a token
    boundary of some turn). A training forward over each whole episode with the old weights scores its version-0
    tokens, with the new weights its version-1 tokens, each within 1e-4 of the rollout's log-probs; versions never
    decrease along a response (tool turns, holes, take their policy token's); some episode switched mid-episode."""
    model, processor, chat, table, executor = parts
    set_end_of_turn(model, processor, 1.0)
    new = copy.deepcopy(model)
    with torch.no_grad():
        for param in new.parameters():
            param.add_(0.3 * torch.randn_like(param) * (param.std() if param.numel() > 1 else 1.0))
    engine = HFRolloutEngine(copy.deepcopy(model), processor, CPU, micro_batch_size=8, owns_weights=True)
    polls = []

    def poll() -> bool:
        polls.append(len(polls))
        if len(polls) != 5:
            return False
        engine.update_weights((k, v.detach().clone()) for k, v in new.named_parameters())
        return True

    engine.updates = InFlightUpdates(poll, lambda: int(len(polls) >= 5), every=1)
    table.calls = [ZOOM]
    agent = AgentLoop(engine, chat, table, executor, tool_limits=TOOL_LIMITS,
                      limits=EpisodeLimits(max_turns=3, max_tool_calls=4, max_tokens=600, max_new_tokens=12))
    torch.manual_seed(1)
    episodes, _ = agent.run(prompts(processor), SamplingParams(n=2, temperature=1.0, max_new_tokens=12))
    scoring = Scoring(1.0, tuple(vision_token_ids(processor)), False, 0)
    mid_episode = 0
    for episode in episodes:
        response = episode.response()
        versions, at = response["versions"], response["policy_mask"] > 0
        assert torch.equal(versions, versions.sort().values)  # never older along the response
        inputs = collate([episode.context()], processor.tokenizer.pad_token_id, share_media=True)
        with torch.no_grad():
            old_logp = PolicyForward(model)(inputs, response["ids"][None], at[None], scoring)[0][0]
            new_logp = PolicyForward(new)(inputs, response["ids"][None], at[None], scoring)[0][0]
        expected = torch.where(versions == 0, old_logp, new_logp)
        assert torch.allclose(expected[at], response["log_probs"][at], atol=1e-4), episode.prompt.name
        mid_episode += len(set(versions[at].tolist())) == 2
    assert mid_episode
