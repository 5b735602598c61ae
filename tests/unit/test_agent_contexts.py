"""A prompt's n episodes share its pixels: on the rank that runs them (one encoding, read through by their contexts),
in what their scoring contexts cost on the wire (one copy of the prompt per group), and in the vision tower's rollout
turns (each prompt image once for its n episodes). And the async mode's path: a rollout-pool rank's agent samples,
as the driver hands them to the reward model's and the judge's ranks, are scored there.

The tiny model is random: the table (a subclass here) reads a zoom call into every turn, and the end-of-turn token's
head row is set so that every policy turn is that token alone (each episode: a call, its tool turn with one zoomed
image, a last turn cut by ``max_turns``).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from mmrl.agent.calls import CallError, ToolCall
from mmrl.agent.chat import ChatFormat, reserved_for
from mmrl.agent.context import JoinedPrompt
from mmrl.agent.episode import Episode, EpisodeLimits
from mmrl.agent.executor import ToolExecutor
from mmrl.agent.loop import AgentLoop
from mmrl.agent.outputs import ToolLimits
from mmrl.agent.rollout import AgentRollout
from mmrl.agent.table import ToolTable, build_tool_table
from mmrl.config import RewardConfig
from mmrl.controller.dispatch import CONTEXT, DISPATCH_ATTR, Dispatch, collect, split_args
from mmrl.models.encoding import collate
from mmrl.models.forward import ValueModel
from mmrl.models.loading import load_model, load_processor
from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams
from mmrl.rollout.hf import HFRolloutEngine
from mmrl.workers.judge import JudgeWorker
from mmrl.workers.prompts import PromptCache
from mmrl.workers.reward_model import RewardModelWorker, sequence_scores
from mmrl.workers.rollout_worker import RolloutWorker

CPU = torch.device("cpu")
N = 3  # episodes per prompt
LIMITS = EpisodeLimits(max_turns=2, max_tool_calls=4, max_tokens=600, max_new_tokens=4)


class ZoomEveryTurn(ToolTable):
    """The table, but every policy turn holds one zoom call (the random model's decision, made for it)."""

    def parse(self, text: str) -> list[ToolCall | CallError]:
        return [ToolCall("zoom_in", {"bbox_2d": [0, 0, 28, 28]})]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def parts(tiny_model_dir: Path) -> Iterator[tuple]:
    processor = load_processor(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir)).eval()
    inputs = collate([PromptCache(processor).attach(rows())["prompt"][0]], processor.tokenizer.pad_token_id)
    with torch.no_grad():  # the end-of-turn token's row along the typical final state: every turn ends at once
        states = model(**inputs, output_hidden_states=True).hidden_states[-1][0]
        model.lm_head.weight[processor.tokenizer.eos_token_id] = 6.0 * states.mean(0) / states.mean(0).norm()
    with ToolExecutor(isolation="inline", timeout_s=10.0) as executor:
        table = ZoomEveryTurn(list(build_tool_table(["zoom_in"], executor)))
        engine = HFRolloutEngine(model, processor, CPU, micro_batch_size=8)
        chat = ChatFormat(processor)
        yield model, processor, engine, AgentLoop(engine, chat, table, executor, limits=LIMITS,
                                                  tool_limits=ToolLimits(max_pixels=56 * 56))


def png(colour: tuple[int, int, int], size: tuple[int, int], noise: bool = False) -> bytes:
    """A plain image, or (``noise``) one of random pixels, whose PNG is about as large as its pixels."""
    image = Image.new("RGB", size, colour)
    if noise:
        generator = torch.Generator().manual_seed(0)
        image = Image.frombytes("RGB", size, torch.randint(0, 256, (size[0] * size[1] * 3,), dtype=torch.uint8,
                                                           generator=generator).numpy().tobytes())
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def rows() -> Batch:
    """Two prompt rows as the driver holds them: one image of 224 x 224 (noise), and two smaller ones."""
    return Batch(objects={
        "uid": ["p0", "p1"], "data_source": ["zoom", "zoom"], "answer": ["red", "blue"], "extra": [{}, {}],
        "messages": [[{"role": "user", "content": "<image>What colour is the circle in A1?"}],
                     [{"role": "user", "content": "<image><image>Which is red?"}]],
        "images": [[png((200, 40, 40), (224, 224), noise=True)],
                   [png((40, 40, 200), (112, 112)), png((200, 40, 40), (56, 112))]],
    })


def vision_images(model) -> tuple[dict[str, int], object]:
    """A counter of the images the vision tower is run on, and its hook (remove it)."""
    seen = {"images": 0}

    def count(module, args, kwargs) -> None:
        seen["images"] += int(kwargs["grid_thw"].shape[0])

    return seen, model.model.visual.register_forward_pre_hook(count, with_kwargs=True)


def pixels(prompt) -> int:
    return prompt.pixel_values.nbytes


def test_a_prompt_s_episodes_hold_its_encoding_and_their_contexts_ship_its_pixels_once(parts) -> None:
    model, processor, _, loop = parts
    prompts = PromptCache(processor).attach(rows())["prompt"]
    seen, hook = vision_images(model)
    try:
        episodes, _ = loop.run(prompts, SamplingParams(n=N, greedy=True, max_new_tokens=4))
    finally:
        hook.remove()
    assert [len(e.calls) for e in episodes] == [1] * 2 * N and all(e.cut == "max_turns" for e in episodes)
    # The vision tower, counted at the tower: each prompt image once for its n episodes (the first turn prefills a
    # prompt once), then each zoomed image once (a later turn continues the kept cache).
    assert seen["images"] == 1 + 2 + 2 * N
    contexts = [e.scoring_context() for e in episodes]
    for i, (episode, context) in enumerate(zip(episodes, contexts)):
        prompt = prompts[i // N]
        assert episode.prompt is prompt and context.media_parts[0] is prompt  # the one encoding, not a copy
        assert all(a is b for a, b in zip(episode.images, prompt.source_images))
        tool = episode.turns[1].encoded
        assert context.media_parts[1].pixel_values is tool.pixel_values
        assert torch.equal(context.pixel_values, torch.cat([prompt.pixel_values, tool.pixel_values]))
        assert torch.equal(context.image_grid_thw, episode.context().image_grid_thw)
    # Without tool media a context's pixels are the prompt's own tensor.
    answered = Episode(prompts[0], [], [], turns=episodes[0].turns[:1])
    assert answered.scoring_context().pixel_values is prompts[0].pixel_values
    assert answered.context().pixel_values is prompts[0].pixel_values
    # What a group's contexts cost pickled together (a rank's samples going back, a scoring rank's call): the
    # prompt's pixels once and each episode's tool image, where n copies of the prompt cost N - 1 more of it.
    group = contexts[:N]
    tools = sum(pixels(c.media_parts[1]) for c in group)
    size = len(pickle.dumps(group, pickle.HIGHEST_PROTOCOL))
    assert pixels(prompts[0]) + tools < size < 1.2 * pixels(prompts[0]) + tools
    # The trainer's passes collate contexts with shared media: the prompt's image once for its group, each tool image
    # once (an episode's own), at the vision tower's input.
    shared = collate(group, processor.tokenizer.pad_token_id, share_media=True)
    assert shared["pixel_values"].nbytes == pixels(prompts[0]) + tools
    assert shared["image_grid_thw_distinct"].shape[0] == 1 + N
    assert shared["image_distinct_index"].tolist() == [i for k in range(N) for i in (0, 1 + k)]
    shipped = pickle.loads(pickle.dumps(group, pickle.HIGHEST_PROTOCOL))
    assert all(isinstance(c, JoinedPrompt) and c.media_parts[0] is shipped[0].media_parts[0] for c in shipped)
    assert shipped[0].media_parts[0].source_images == []  # the stored images stay on the rank
    for ours, theirs in zip(group, shipped):
        assert torch.equal(ours.pixel_values, theirs.pixel_values)
        assert torch.equal(ours.response_mm_types, theirs.response_mm_types)


def pool_samples(parts) -> tuple[Batch, list]:
    """A rollout-pool rank's agent samples (its ``episodes``, with its own agent's samples), as the async source
    gives them to the trainer (its prompt rows repeated, joined with the samples); and the local contexts."""
    model, processor, _, loop = parts
    agent = AgentRollout.__new__(AgentRollout)
    agent.loop, agent.pad_id = loop, processor.tokenizer.pad_token_id
    rank = SimpleNamespace(agent=agent, rank=0, serial=0, version=0)
    prompts = rows()
    encoded = PromptCache(processor).attach(prompts, keep=False)["prompt"]
    samples = RolloutWorker.episodes(rank, encoded, SamplingParams(n=N, greedy=True, max_new_tokens=4))
    local = list(samples[CONTEXT])
    return prompts.repeat(N).union(samples), local


def shipped_parts(spec_of, batch: Batch) -> tuple[list[Batch], object]:
    """Each of two ranks' part of a call, pickled and unpickled as the call sends it; and the plan."""
    spec = getattr(spec_of, DISPATCH_ATTR)
    per_rank, plan = split_args(spec, 2, (batch,), {}, placement={}, held=[set(), set()])
    return [pickle.loads(pickle.dumps(args[0], pickle.HIGHEST_PROTOCOL)) for args, _ in per_rank], plan


def test_a_reward_model_and_a_judge_score_the_rollout_pool_s_agent_samples(parts) -> None:
    """The async mode's path at unit level: the pool rank's contexts reach the reward model's ranks with one copy
    of each prompt's pixels per group, and score there as on the rank that ran them; the judge's ranks read each
    episode's transcript with the prompt's images and the tools'."""
    model, processor, engine, _ = parts
    batch, local = pool_samples(parts)
    pad = processor.tokenizer.pad_token_id
    torch.manual_seed(0)
    reward_model = ValueModel.from_policy(model).eval()
    torch.nn.init.normal_(reward_model.value_head.weight)
    with torch.no_grad():
        expected = sequence_scores(reward_model, Batch(tensors={k: batch[k] for k in ("responses", "response_mask")},
                                                      objects={"prompt": local}), pad, CPU)
        parts_, plan = shipped_parts(RewardModelWorker.compute_rm_scores, batch)
        results = []
        for part in parts_:
            (uid,) = set(part["uid"])  # a group to each rank
            prompt_bytes = pixels(local[batch["uid"].index(uid)].media_parts[0])
            tools = sum(pixels(c.media_parts[1]) for c in part[CONTEXT])
            # The group's contexts, with one copy of the prompt's pixels and not the prompt's PNG as well.
            assert part["images"] == [None] * len(part)
            assert len(pickle.dumps(part, pickle.HIGHEST_PROTOCOL)) < 1.2 * prompt_bytes + tools + 20_000
            attached = PromptCache(processor=None).attach(part)  # the reward model's rank finds each context
            assert len({id(c.media_parts[0]) for c in attached["prompt"]}) == 1
            results.append(Batch(tensors={"rm_scores": sequence_scores(reward_model, attached, pad, CPU)}))
    scores = collect(Dispatch.DP_COMPUTE, results, plan)["rm_scores"]
    assert torch.allclose(scores, expected, atol=1e-5) and float(scores.std()) > 0
    # The judge: each question is the prompt's images, then the episode's zoomed image, and gets a verdict.
    judge = SimpleNamespace(template=RewardConfig().judge.template, max_new_tokens=2, processor=processor,
                            reserved=reserved_for(processor), engine=engine)
    seen, hook = vision_images(model)
    try:
        verdicts = [JudgeWorker.judge(judge, part) for part in shipped_parts(JudgeWorker.judge, batch)[0]]
    finally:
        hook.remove()
    assert [len(v) for v in verdicts] == [N, N] and all(set(v["judge_scores"].tolist()) <= {0.0, 1.0} for v in verdicts)
    assert seen["images"] == N * (1 + 1) + N * (2 + 1)  # per question: its prompt's images and the episode's zoom
