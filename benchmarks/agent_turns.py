"""``make bench`` (fourth part): what the next turn of an agent episode costs to encode.

The agent loop encodes a tool turn once, when it arrives (:meth:`mmrl.agent.chat.ChatFormat.encode_turn`), and
builds the next policy turn's prompt by joining the encodings it holds (:meth:`mmrl.agent.episode.Episode.context`):
the question's image and the earlier tool turns are not processed again. The baseline is what a loop that kept
only the messages would do: the whole conversation through the chat template and the processor at every turn
(:func:`mmrl.models.encoding.encode_prompt`). Both are timed for the prompt of the turn after k zoom calls
(k = 1 to ``--turns``): the loop encodes the k-th tool turn and joins, the baseline encodes everything. On the
agent demo's tiny model and tokenizer; the two encodings are checked equal (ids, token types, pixels, grids)
before anything is timed.

Then the model's side: the hf engine's next policy turn (8 greedy tokens) after k zoom calls, continued from
the cache the episode kept after its previous turn (:meth:`mmrl.rollout.hf.HFRolloutEngine.continue_generate`:
the end-of-turn token, the tool turn and its image prefilled) against a prefill of the whole context (the
board's image and every zoom through the vision tower again). The kept caches are made beforehand by the
engine itself, as the loop makes them; the two give the same tokens (checked before timing).

    python -m benchmarks.agent_turns --config configs/agent_demo.yaml
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import print_table
from data_prep.zoom_task import generate_zoom_rows
from mmrl.agent.builtin import zoom_in
from mmrl.agent.chat import ChatFormat
from mmrl.agent.episode import Episode
from mmrl.agent.executor import ToolExecutor
from mmrl.agent.outputs import ToolOutput
from mmrl.agent.table import build_tool_table
from mmrl.config import load_config
from mmrl.models.encoding import MEDIA_FIELDS, EncodedPrompt, encode_prompt
from mmrl.models.loading import load_model, load_processor
from mmrl.rollout.base import SamplingParams
from mmrl.rollout.hf import HFRolloutEngine
from mmrl.models.tiny import build_tiny_vlm
from mmrl.schema import IMAGE_PLACEHOLDER, decode_image
from pipelines import model as model_stage
from pipelines.data import zoom_board

ROWS = 16
REPEATS = 5


def episode_parts(chat: ChatFormat, tools: list[dict], row: dict, calls: int) -> tuple[list[dict], list, list]:
    """A zoom-task row as an episode of ``calls`` zoom calls on its cell: its messages (the question with the
    tools, then each call and tool turn), its images (the board's, then each zoom's) and the tool outputs."""
    board = decode_image(row["images"][0])
    messages = chat.with_tools(chat.in_format(row["messages"]), tools)
    side = chat.model_image_sizes(encode_prompt(chat.processor, messages, [board]))[0]
    box = [0, 0, side[0] // 2, side[1] // 2]
    images, outputs = [board], []
    for _ in range(calls):
        zoomed = zoom_in(box, images=[board], model_image_sizes=[side], max_pixels=side[0] * side[1])
        outputs.append(ToolOutput(images=(zoomed,)))
        images.append(zoomed)
        messages = [*messages, {"role": "assistant", "content": chat.calls.format_call("zoom_in", {"bbox_2d": box})},
                    {"role": "tool", "content": IMAGE_PLACEHOLDER}]
    return messages, images, outputs


def incremental(chat: ChatFormat, prompt: EncodedPrompt, row_messages: list[dict], outputs: list) -> Episode:
    """The episode as the loop holds it: the prompt, each call's ids, each tool turn encoded once."""
    episode = Episode(prompt, list(prompt.source_images), chat.model_image_sizes(prompt))
    tokenizer = chat.processor.tokenizer
    calls = [m["content"] for m in row_messages if m["role"] == "assistant"]
    for call, output in zip(calls, outputs):
        ids = torch.tensor([*tokenizer(call, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id])
        episode.add_policy_turn(ids, torch.zeros(len(ids)), call, [])
        turn = chat.encode_turn([output])
        episode.add_tool_turn(turn, [], chat.model_image_sizes(turn))
    return episode


def same(a: EncodedPrompt, b: EncodedPrompt) -> bool:
    return torch.equal(a.input_ids, b.input_ids) and torch.equal(a.mm_token_type_ids, b.mm_token_type_ids) and all(
        (getattr(a, k) is None and getattr(b, k) is None) or torch.equal(getattr(a, k), getattr(b, k))
        for k in MEDIA_FIELDS)


def before_last_call(chat: ChatFormat, episode: Episode) -> EncodedPrompt:
    """The context the engine had run when the episode's last call ended: every turn but the last tool turn,
    and the last policy turn without its end-of-turn token."""
    earlier = Episode(episode.prompt, [], [], turns=episode.turns[:-2])
    last = episode.turns[-2]
    earlier.add_policy_turn(last.ids[:-1], last.log_probs[:-1], last.text, [])
    return earlier.context()


def model_side(chat: ChatFormat, model_path: Path, episodes: list[Episode]) -> tuple[float, float]:
    """ms per episode of the next 8-token greedy turn: (whole context prefilled, continued from the kept cache)."""
    processor = chat.processor
    engine = HFRolloutEngine(load_model(str(model_path)).eval(), processor, torch.device("cpu"))
    eos = processor.tokenizer.eos_token_id
    only_eos = [i for i in range(len(processor.tokenizer)) if i != eos]
    # The engine's own kept caches: a turn of the end-of-turn token alone (every other token banned for it) after
    # each context's last call.
    engine.banned_ids, banned = only_eos, engine.banned_ids
    made = engine.generate([before_last_call(chat, e) for e in episodes],
                           SamplingParams(n=1, greedy=True, max_new_tokens=1), keep=True)
    engine.banned_ids = banned
    contexts = [e.context() for e in episodes]
    suffixes = [e.context_from(k.length) for e, k in zip(episodes, made.kept)]
    turn = SamplingParams(n=1, greedy=True, max_new_tokens=8)
    whole = lambda: engine.generate(contexts, turn)
    kept = lambda: engine.continue_generate(contexts, suffixes, made.kept, turn)
    if not torch.equal(whole().responses, kept().responses):
        raise AssertionError("the turn continued from the kept cache differs from the whole context's")
    return median_ms(whole) / len(episodes), median_ms(kept) / len(episodes)


def median_ms(fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> list[list[str]]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/agent_demo.yaml")
    parser.add_argument("--turns", type=int, default=3, help="the most zoom calls per episode")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    with tempfile.TemporaryDirectory() as tmp, ToolExecutor(isolation="inline") as executor:
        path = build_tiny_vlm(model_stage.task_corpus(cfg), cfg.tiny_model, Path(tmp) / "model", cfg.seed,
                              cfg.model.family)
        chat = ChatFormat(load_processor(str(path)))
        tools = build_tool_table(["zoom_in"], executor).definitions()
        rows, _, _ = generate_zoom_rows(ROWS, cfg.seed, zoom_board(cfg), "bench")
        table, generation = [], []
        for calls in range(1, args.turns + 1):
            cases = [episode_parts(chat, tools, row, calls) for row in rows]
            prompts = [encode_prompt(chat.processor, chat.with_tools(chat.in_format(row["messages"]), tools),
                                     [decode_image(row["images"][0])]) for row in rows]
            for (messages, images, outputs), prompt in zip(cases, prompts):
                whole = encode_prompt(chat.processor, chat.in_format(messages), images)
                if not same(incremental(chat, prompt, messages, outputs).context(), whole):
                    raise AssertionError("the loop's joined context differs from the whole conversation's encoding")
            episodes = [incremental(chat, p, m, o) for (m, _, o), p in zip(cases, prompts)]
            # The loop's work for this turn's prompt: the newest tool turn encoded, then the held parts joined.
            joined = (median_ms(lambda: [chat.encode_turn(o[-1:]) for _, _, o in cases])
                      + median_ms(lambda: [e.context() for e in episodes]))
            scratch = median_ms(lambda: [encode_prompt(chat.processor, chat.in_format(m), i) for m, i, _ in cases])
            tokens = statistics.fmean(len(encode_prompt(chat.processor, chat.in_format(m), i)) for m, i, _ in cases)
            table.append([str(calls), f"{tokens:.0f}", f"{scratch / ROWS:.2f}", f"{joined / ROWS:.2f}",
                          f"{scratch / joined:.2f}x"])
            prefill_whole, prefill_kept = model_side(chat, path, episodes)
            generation.append([str(calls), f"{tokens:.0f}", f"{prefill_whole:.2f}", f"{prefill_kept:.2f}",
                               f"{prefill_whole / prefill_kept:.2f}x"])
    print_table(f"agent: encoding the prompt of the turn after k tool turns (ms per episode, median of {REPEATS}, "
                f"{ROWS} zoom-task episodes)", ["k", "context tokens", "whole conversation", "loop (joined)",
                                                  "speed-up"], table)
    print_table(f"agent: the hf engine's next turn (8 greedy tokens) after k tool turns (ms per episode, median of "
                f"{REPEATS}, {ROWS} episodes in one batch)", ["k", "context tokens", "whole context prefilled",
                                                              "kept cache continued", "speed-up"], generation)
    return table + generation


if __name__ == "__main__":
    main()
