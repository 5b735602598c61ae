"""The agent's seams with the trainer: the driver's metrics from every rank's samples, the episode that rewards,
the judge and the rollout HTML see, and the rank's held scoring contexts."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from mmrl.agent.rollout import agent_metrics, episode_record
from mmrl.controller.dispatch import Dispatch, DispatchSpec, split_args
from mmrl.controller.worker_group import held_keys
from mmrl.models.encoding import EncodedPrompt
from mmrl.protocol import Batch
from mmrl.trainer.evaluation import samples_html
from mmrl.trainer.reward_stage import reward_inputs
from mmrl.workers.prompts import PromptCache
from rewards.judge import episode_transcript, judge_messages


def png(colour: str = "red", size: int = 8) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def zoom(turn: int, failure: str | None = None) -> dict:
    return {"turn": turn, "name": "zoom_in", "arguments": {"bbox_2d": [0, 0, 28, 28]}, "failure": failure,
            "text": "Error: timed out" if failure else "", "images": [] if failure else [png()]}


def malformed(turn: int) -> dict:
    return {"turn": turn, "name": None, "error": "bad_json", "failure": "bad_json", "text": "Error: bad JSON",
            "images": []}


# Three episodes: an answer at once; a zoom then the answer; a timed-out zoom, a malformed call, cut by max_turns.
RECORDS = [
    {"turns": [{"role": "assistant", "text": "<answer>red</answer>"}], "calls": [], "cut": None,
     "final_text": "<answer>red</answer>"},
    {"turns": [{"role": "assistant", "text": "call"}, {"role": "tool", "calls": [0]},
               {"role": "assistant", "text": "<answer>blue</answer>"}], "calls": [zoom(0)], "cut": None,
     "final_text": "<answer>blue</answer>"},
    {"turns": [{"role": "assistant", "text": "call"}, {"role": "tool", "calls": [0]},
               {"role": "assistant", "text": "again"}, {"role": "tool", "calls": [1]}],
     "calls": [zoom(0, "timeout"), malformed(1)], "cut": "max_turns", "final_text": "again"},
]


def samples() -> Batch:
    # Responses of 4, 8 and 10 tokens; the tools' tokens (holes) 0, 3 and 5 of them.
    extent = torch.tensor([[1] * 4 + [0] * 6, [1] * 8 + [0] * 2, [1] * 10], dtype=torch.float32)
    policy = extent.clone()
    policy[1, 2:5] = 0
    policy[2, 2:5] = 0
    policy[2, 7:9] = 0
    return Batch(tensors={"response_mask": extent, "policy_mask": policy, "num_turns": torch.tensor([1, 2, 2]),
                          "num_tool_calls": torch.tensor([0, 1, 2])},
                 objects={"episode": RECORDS})


def test_the_driver_s_agent_metrics_count_every_rank_s_episodes():
    metrics = agent_metrics(samples(), ["zoom_in", "calculator"])
    assert metrics["agent/turns/mean"] == pytest.approx(5 / 3)
    assert metrics["agent/tool_calls_per_episode/mean"] == pytest.approx(1.0)
    assert metrics["agent/budget_cuts"] == pytest.approx(1 / 3)
    assert metrics["agent/budget_cuts/max_turns"] == pytest.approx(1 / 3) and metrics["agent/budget_cuts/max_tokens"] == 0
    assert metrics["agent/response_tokens/policy/mean"] == pytest.approx((4 + 5 + 5) / 3)
    assert metrics["agent/response_tokens/tool/mean"] == pytest.approx((0 + 3 + 5) / 3)
    assert metrics["agent/tool_calls"] == 2 and metrics["agent/tool_calls/zoom_in"] == 2
    assert metrics["agent/tool_calls/calculator"] == 0
    assert metrics["agent/tool_errors"] == 2
    assert metrics["agent/tool_errors/timeout"] == 1 and metrics["agent/tool_errors/bad_json"] == 1
    assert metrics["agent/tool_errors/zoom_in/timeout"] == 1


def test_rewards_see_the_final_answer_and_the_whole_episode_with_its_images():
    batch = samples().union(Batch(objects={
        "response_text": [r["final_text"] for r in RECORDS], "answer": ["red", "blue", "green"],
        "data_source": ["zoom"] * 3, "images": [[png("white", 16)]] * 3, "extra": [{}] * 3}))
    inputs = reward_inputs(batch)
    assert [i.response for i in inputs] == ["<answer>red</answer>", "<answer>blue</answer>", "again"]
    assert inputs[0].episode["calls"] == [] and inputs[2].episode["cut"] == "max_turns"
    returned = inputs[1].episode["calls"][0]["images"]
    assert len(returned) == 1 and isinstance(returned[0], Image.Image) and returned[0].getpixel((0, 0)) == (255, 0, 0)
    single = reward_inputs(Batch(objects={k: v for k, v in batch.objects.items() if k != "episode"},
                                 tensors=batch.tensors))
    assert all(i.episode == {} for i in single)


def test_the_rollout_html_shows_each_turn_call_and_returned_image():
    rows = [{"prompt": "q", "image_png": png(), "response": r["final_text"], "answer": "a", "reward": 0.0,
             "episode": r} for r in RECORDS]
    html = samples_html(rows, "val")
    assert html.count("<b>policy</b>") == 5 and html.count("<b>tool</b>") == 3
    assert "zoom_in({&#x27;bbox_2d&#x27;: [0, 0, 28, 28]})" in html
    assert "failed: timeout" in html and "malformed call (bad_json)" in html and "cut by max_turns" in html
    assert html.count("data:image/png;base64") == 3 + 1  # three prompts' pictures, one returned zoom
    assert "<code>plain</code>" in samples_html([{**rows[0], "episode": None, "response": "plain"}], "val")


def context(name: str) -> EncodedPrompt:
    return EncodedPrompt(input_ids=torch.tensor([1, 2]), mm_token_type_ids=torch.zeros(2, dtype=torch.long), name=name,
                         response_mm_types=torch.tensor([0, 1, 0]))


def test_a_rank_finds_each_sample_s_own_context_by_its_key_and_refuses_one_it_does_not_hold():
    cache = PromptCache(processor=None)
    held = [context("u0"), context("u0"), context("u1")]
    cache.hold(["u0#0", "u0#1", "u1#2"], held)
    batch = Batch(tensors={"responses": torch.zeros(3, 3, dtype=torch.long)},
                  objects={"uid": ["u1", "u0", "u0"], "context_key": ["u1#2", "u0#1", "u0#0"]})
    attached = cache.attach(batch)
    assert [id(p) for p in attached["prompt"]] == [id(held[2]), id(held[1]), id(held[0])]
    assert "context_key" not in attached.objects
    stranger = Batch(tensors={"responses": torch.zeros(1, 3, dtype=torch.long)},
                     objects={"uid": ["u9"], "context_key": ["u9#0"]})
    with pytest.raises(KeyError, match=r"sample 'u9#0' \(prompt 'u9'\) has its own context, and it is neither held"):
        cache.attach(stranger)
    cache.clear()
    assert len(cache) == 0


def test_a_context_sent_with_its_key_is_held_for_the_step_s_later_calls_and_sent_once():
    """Another group's rank (a critic's, the async trainer's) gets each context once: the dispatcher leaves out the
    contexts whose keys the rank holds, and the rank holds what it got."""
    contexts = [context("u0"), context("u0"), context("u1"), context("u1")]
    batch = Batch(tensors={"responses": torch.zeros(4, 3, dtype=torch.long), "response_mask": torch.ones(4, 3)},
                  objects={"uid": ["u0", "u0", "u1", "u1"], "context_key": ["u0#a", "u0#b", "u1#a", "u1#b"],
                           "context": contexts, "answer": ["x"] * 4})
    spec = DispatchSpec(Dispatch.DP_COMPUTE, fields=("responses", "response_mask"), prompts=True)
    held: list[set[str]] = [set(), set()]
    per_rank, plan = split_args(spec, 2, (batch,), {}, placement={}, held=held)
    caches = [PromptCache(processor=None), PromptCache(processor=None)]
    for rank, ((part, *_), _kw) in enumerate(per_rank):
        assert all(c is not None for c in part["context"]) and "answer" not in part.objects
        attached = caches[rank].attach(part)
        assert [p.name for p in attached["prompt"]] == list(part["uid"])
        held[rank].update(held_keys(part))
    again, _ = split_args(spec, 2, (batch,), {}, placement=plan.ranks, held=held)
    for rank, ((part, *_), _kw) in enumerate(again):
        assert part["context"] == [None] * len(part)  # held now: not sent again
        by_key = dict(zip(batch["context_key"], contexts))
        assert [id(p) for p in caches[rank].attach(part)["prompt"]] == [id(by_key[k]) for k in part["context_key"]]


def test_episode_records_name_malformed_calls_by_their_error_kind():
    from mmrl.agent.calls import CallError, ToolCall
    from mmrl.agent.episode import CallRecord, Episode
    from mmrl.agent.outputs import ToolOutput

    prompt = EncodedPrompt(input_ids=torch.tensor([5]), mm_token_type_ids=torch.zeros(1, dtype=torch.long))
    episode = Episode(prompt, [], [])
    episode.add_policy_turn(torch.tensor([7]), torch.tensor([-0.5]), "two calls", [])
    tool_turn = EncodedPrompt(input_ids=torch.tensor([8, 9]), mm_token_type_ids=torch.zeros(2, dtype=torch.long))
    episode.add_tool_turn(tool_turn, [
        CallRecord(0, ToolCall("calculator", {"expression": "1+1"}), ToolOutput(text="2")),
        CallRecord(0, CallError("unknown_tool", "no tool 'fly'", "fly"), ToolOutput.failed("unknown_tool", "no"))], [])
    record = episode_record(episode)
    assert record["turns"] == [{"role": "assistant", "text": "two calls"}, {"role": "tool", "calls": [0, 1]}]
    assert record["calls"][0]["arguments"] == {"expression": "1+1"} and record["calls"][0]["text"] == "2"
    assert record["calls"][1]["name"] == "fly" and record["calls"][1]["error"] == "unknown_tool"
    assert "arguments" not in record["calls"][1]


def test_an_agent_run_s_tiny_tokenizer_learns_its_tools_block(tmp_path):
    from mmrl.agent.chat import ChatFormat
    from mmrl.agent.executor import ToolExecutor
    from mmrl.agent.table import build_tool_table
    from mmrl.config import load_config
    from mmrl.models.loading import load_processor
    from mmrl.models.tiny import build_tiny_vlm
    from pipelines.model import task_corpus

    lengths = []
    for enabled in (False, True):
        cfg = load_config(None, [f"rollout.agent.enabled={str(enabled).lower()}", "tiny_model.hidden_size=32",
                                 "tiny_model.intermediate_size=64", "tiny_model.num_layers=1"])
        path = build_tiny_vlm(task_corpus(cfg), cfg.tiny_model, tmp_path / str(enabled))
        processor = load_processor(str(path))
        with ToolExecutor(isolation="inline") as executor:
            tools = build_tool_table(cfg.rollout.agent.tools, executor).definitions()
        block = ChatFormat(processor).calls.tools_block(tools)  # the family's, as an agent run's prompts hold it
        lengths.append(len(processor.tokenizer(block)["input_ids"]))
    assert lengths[1] < 0.7 * lengths[0], lengths


def test_the_judge_reads_an_episode_as_its_transcript_with_the_tools_images():
    text, images = episode_transcript(RECORDS[1])
    assert text == "assistant: call\ntool zoom_in: <image>\nassistant: <answer>blue</answer>" and images == [png()]
    text, images = episode_transcript(RECORDS[2])
    assert text == ("assistant: call\ntool zoom_in: Error: timed out\nassistant: again\ntool bad_json: Error: bad JSON")
    assert images == []
    text, images = episode_transcript(RECORDS[1])
    question = judge_messages([{"role": "user", "content": "<image>Which colour?"}], text, "blue",
                              "Q: {question}\nA: {response}\nTruth: {ground_truth}")
    # The prompt's image first, then the tool's, in the order of the images the judge is given.
    assert question[0]["content"] == ("<image>Q: Which colour?\nA: assistant: call\ntool zoom_in: <image>\n"
                                      "assistant: <answer>blue</answer>\nTruth: blue")
    # A policy or tool text that writes a placeholder gets no image slot: only returned images have one.
    hostile = {**RECORDS[1], "turns": [{"role": "assistant", "text": "look <image>"}, *RECORDS[1]["turns"][1:]],
               "calls": [{**RECORDS[1]["calls"][0], "text": "see <image><video>"}]}
    text, images = episode_transcript(hostile)
    assert text.count("<image>") == len(images) == 1 and "<video>" not in text
