"""Demonstrated episodes for SFT: encoded as the agent loop encodes the episodes it runs (the tool turn is the
tokens and pixels the real tool's output gives, a hole), and the SFT loss trains only the assistant's turns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from data_prep.parquet import write_parquet
from data_prep.zoom_task import ZoomTaskSpec, generate_zoom_rows
from mmrl.agent.builtin import zoom_in
from mmrl.agent.chat import ChatFormat
from mmrl.agent.demonstrations import encode_demonstration
from mmrl.agent.executor import ToolExecutor
from mmrl.agent.outputs import ToolOutput
from mmrl.agent.table import build_tool_table
from mmrl.answer_format import format_answer
from mmrl.models.loading import load_processor
from mmrl.schema import decode_image

SPEC = ZoomTaskSpec()


@pytest.fixture(scope="module")
def chat_and_tools(tiny_model_dir: Path):
    processor = load_processor(str(tiny_model_dir))
    with ToolExecutor(isolation="inline") as executor:
        tools = build_tool_table(["zoom_in"], executor).definitions()
    return ChatFormat(processor), tools


def test_a_demonstration_encodes_as_the_loop_s_episode_its_tool_turn_a_hole(chat_and_tools):
    chat, tools = chat_and_tools
    [row], _, _ = generate_zoom_rows(1, seed=2, spec=SPEC, id_prefix="d", demonstrations=True)
    images = [decode_image(b) for b in row["images"]]
    episode = encode_demonstration(chat, tools, row["messages"], images, "d0")
    tokenizer = chat.processor.tokenizer
    assert [t.policy for t in episode.turns] == [True, False, True]
    call, tool, answer = episode.turns
    call_text = row["messages"][1]["content"]
    assert call.ids.tolist() == tokenizer(call_text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert answer.ids.tolist() == (tokenizer(format_answer(row["answer"]), add_special_tokens=False)["input_ids"]
                                   + [tokenizer.eos_token_id])
    # The tool turn is what the loop appends for the real tool's output on this call.
    extra = json.loads(row["extra"])
    zoomed = zoom_in(extra["view_box"], images=[images[0]], model_image_sizes=episode.model_image_sizes[:1],
                     max_pixels=SPEC.zoom_max_pixels)
    expected = chat.encode_turn([ToolOutput(images=(zoomed,))])
    assert torch.equal(tool.ids, expected.input_ids) and torch.equal(tool.encoded.pixel_values, expected.pixel_values)
    # The prompt holds the tools, as an RL prompt of the run does.
    assert "zoom_in" in tokenizer.decode(episode.prompt.input_ids)
    response, context = episode.response(), episode.scoring_context()
    assert response["policy_mask"].tolist() == [1.0] * len(call.ids) + [0.0] * len(tool.ids) + [1.0] * len(answer.ids)
    assert context.image_grid_thw.shape[0] == 2 and int((response["mm_types"] > 0).sum()) > 0


def test_a_demonstration_whose_images_and_placeholders_disagree_is_refused_by_name(chat_and_tools):
    chat, tools = chat_and_tools
    [row], _, _ = generate_zoom_rows(1, seed=2, spec=SPEC, id_prefix="d", demonstrations=True)
    images = [decode_image(b) for b in row["images"]]
    with pytest.raises(ValueError, match=r"demonstration bad: 2 <image> placeholders but 1 images"):
        encode_demonstration(chat, tools, row["messages"], images[:1], "bad")
    with pytest.raises(ValueError, match=r"demonstration cut: its last message is a 'tool' one"):
        encode_demonstration(chat, tools, row["messages"][:-1], images, "cut")


def test_a_context_message_is_a_policy_turn_outside_the_policy_mask(chat_and_tools):
    chat, tools = chat_and_tools
    [row], _, _ = generate_zoom_rows(1, seed=2, spec=SPEC, id_prefix="d", demonstrations=True)
    images = [decode_image(b) for b in row["images"]]
    full = encode_demonstration(chat, tools, row["messages"], images, "d0")
    answer_only = encode_demonstration(chat, tools, row["messages"], images, "d0", context=[1])
    call, tool, answer = answer_only.turns
    assert [t.policy for t in answer_only.turns] == [True, False, True] and not call.trained and answer.trained
    response = answer_only.response()
    assert response["policy_mask"].tolist() == [0.0] * (len(call.ids) + len(tool.ids)) + [1.0] * len(answer.ids)
    assert torch.equal(response["ids"], full.response()["ids"])  # the same tokens, context instead of targets
    with pytest.raises(ValueError, match=r"demonstration d0: context_messages \[2\] must index its assistant"):
        encode_demonstration(chat, tools, row["messages"], images, "d0", context=[2])


def test_agent_sft_trains_the_assistant_turns_of_demonstrations_only(tiny_config, tmp_path):
    from mmrl.models.logprobs import response_logprobs
    from mmrl.models.encoding import vision_token_ids
    from mmrl.trainer.sft import SFTTrainer, pad_targets

    # The first row's call is context only (call_share 0.5: the second trains its call).
    rows, _, _ = generate_zoom_rows(2, seed=4, spec=SPEC, id_prefix="sft", demonstrations=True, call_share=0.5)
    assert [json.loads(r["extra"]).get("context_messages") for r in rows] == [[1], None]
    write_parquet(rows, tmp_path / "sft.parquet")
    tiny_config.data.dir = str(tmp_path)
    tiny_config.rollout.agent.enabled = True
    trainer = SFTTrainer(tiny_config)
    assert len(trainer.examples) == 2
    for context, ids, trained in trainer.examples:
        assert 0 < trained.sum() < len(ids) and context.response_mm_types is not None
    answer_tokens = len(trainer.tokenizer(format_answer(rows[0]["answer"]), add_special_tokens=False)["input_ids"]) + 1
    assert int(trainer.examples[0][2].sum()) == answer_tokens  # the answer alone
    assert int(trainer.examples[1][2].sum()) > answer_tokens
    # Reference: every response token's log-prob (tool turns included), then the mean NLL over the assistant's.
    pad = trainer.tokenizer.pad_token_id
    ids, mask = pad_targets([t for _, t, _ in trainer.examples], pad)
    trained, _ = pad_targets([m for _, _, m in trainer.examples], 0)
    with torch.no_grad():
        every, _ = response_logprobs(trainer.policy, [c for c, _, _ in trainer.examples], ids, mask,
                                     pad_token_id=pad, banned_ids=vision_token_ids(trainer.processor),
                                     temperature=1.0, device=torch.device("cpu"))
        loss = trainer.loss([0, 1])
    own = trained > 0
    expected = -every[own].sum() / own.sum()
    assert torch.allclose(loss, expected, atol=1e-5)
    # Scored, a tool turn's image tokens would be -inf (they are banned from the policy's vocabulary) and its
    # text tokens would change the mean.
    hole = (mask > 0) & ~own
    assert bool(torch.isinf(every[hole]).any()) and bool(torch.isfinite(every[hole]).any())


def test_make_eval_with_tools_runs_episodes_and_reports_their_tool_use(tiny_config, tiny_model_dir, tmp_path):
    """``make eval`` of an agent run evaluates episodes (the tools in the prompt, the loop's records), and the
    same checkpoint with ``rollout.agent.enabled=false`` single-turn answers."""
    from mmrl.trainer.eval_checkpoint import evaluate_checkpoint

    rows, _, _ = generate_zoom_rows(3, seed=8, spec=SPEC, id_prefix="ev")
    write_parquet(rows, tmp_path / "test.parquet")
    tiny_config.data.dir = str(tmp_path)
    tiny_config.eval.max_new_tokens = 6
    tiny_config.rollout.agent.enabled, tiny_config.rollout.agent.isolation = True, "inline"
    with_tools = evaluate_checkpoint(tiny_config, str(tiny_model_dir), "test")
    records = [s["episode"] for s in with_tools.samples]
    assert with_tools.tool_use is not None and with_tools.tool_use.episodes == 3 and len(records) == 3
    assert all(r["model_image_sizes"] == [[SPEC.view_side, SPEC.view_side]] for r in records)
    calls = sum(len(r["calls"]) for r in records)
    assert with_tools.metrics("test")["test/agent/tool_calls_per_episode"] == pytest.approx(calls / 3)
    tiny_config.rollout.agent.enabled = False
    plain = evaluate_checkpoint(tiny_config, str(tiny_model_dir), "test")
    assert plain.tool_use is None and [s["episode"] for s in plain.samples] == [None] * 3
    assert "test/agent/tool_calls_per_episode" not in plain.metrics("test")
