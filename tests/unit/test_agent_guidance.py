"""Off-policy guidance for agent episodes: a guide is a whole episode whose policy turns are scripted (the row's
``extra["guide"]``) and whose tool turns are the real tools' outputs. Its encoding must be the one SFT gives the
same demonstrated episode; a script that ends early, runs long or is cut by a budget is not a usable guide; and
the driver's Guidance writes the episode's fields, record and context key into the all-wrong group's row.
Scripted episodes with real tool images also serve to check that a reward model scores an episode whole."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from data_prep.zoom_task import ZoomTaskSpec, generate_zoom_rows
from mmrl.agent.demonstrations import encode_demonstration
from mmrl.agent.rollout import AgentRollout
from mmrl.answer_format import extract_answer
from mmrl.config import AgentConfig
from mmrl.models.encoding import collate, encode_prompt
from mmrl.models.forward import ValueModel
from mmrl.models.loading import load_model, load_processor
from mmrl.protocol import Batch
from mmrl.rollout.hf import HFRolloutEngine
from mmrl.schema import decode_image
from mmrl.trainer.guidance import GUIDED, Guidance, guide_turns
from mmrl.workers.reward_model import sequence_scores

SPEC = ZoomTaskSpec()


@pytest.fixture(scope="module")
def rollout(tiny_model_dir: Path):
    processor = load_processor(str(tiny_model_dir))
    engine = HFRolloutEngine(load_model(str(tiny_model_dir)).eval(), processor, torch.device("cpu"))
    cfg = AgentConfig(enabled=True, tools=["zoom_in"], isolation="inline", max_turns=2, max_tool_calls=1,
                      max_tokens=600, max_new_tokens=96)
    agent = AgentRollout(cfg, processor, engine, max_new_tokens=96)
    yield agent
    agent.close()


def zoom_row(seed: int, demonstration: bool) -> dict:
    [row], _, _ = generate_zoom_rows(1, seed=seed, spec=SPEC, id_prefix="z", demonstrations=demonstration)
    return row


def encoded(agent: AgentRollout, row: dict, name: str):
    return encode_prompt(agent.processor, agent.messages(row["messages"]), [decode_image(b) for b in row["images"]],
                         name=name)


def test_a_guide_episode_is_encoded_as_sft_encodes_the_same_demonstration(rollout):
    row, demo = zoom_row(3, False), zoom_row(3, True)
    script = json.loads(row["extra"])["guide"]
    assert script == [demo["messages"][1]["content"], demo["messages"][3]["content"]]  # the call, the answer
    out, [context] = rollout.guide([encoded(rollout, row, "z-0")], [script], version=4)
    reference = encode_demonstration(rollout.chat, rollout.table.definitions(), demo["messages"],
                                     [decode_image(b) for b in demo["images"]], "z-0")
    expected = reference.response()
    width = int(out["response_mask"][0].sum())
    assert width == len(expected["ids"])
    assert torch.equal(out["responses"][0, :width], expected["ids"])
    assert torch.equal(out["policy_mask"][0, :width], expected["policy_mask"])  # the tool turn is a hole
    assert torch.equal(context.response_mm_types, expected["mm_types"])
    want = reference.scoring_context()
    assert torch.equal(context.input_ids, want.input_ids) and torch.equal(context.image_grid_thw, want.image_grid_thw)
    assert torch.equal(context.pixel_values, want.pixel_values)  # the real tool's zoom, pixel for pixel
    assert out["guide_complete"].tolist() == [1.0] and out["num_turns"].tolist() == [2]
    assert out["num_tool_calls"].tolist() == [1] and out["weight_version"].tolist() == [4]
    assert not out["rollout_log_probs"].any()  # no engine drew it: the trainer's old log-probs stand in later
    record = out["episode"][0]
    assert out["response_text"] == [script[1]] and extract_answer(record["final_text"]) == row["answer"]
    assert record["calls"][0]["arguments"] == {"bbox_2d": json.loads(row["extra"])["view_box"]}
    assert len(record["calls"][0]["images"]) == 1 and context.name == "z-0"


def test_a_guide_that_stops_early_runs_long_or_is_cut_is_not_complete(rollout):
    row = zoom_row(5, False)
    call, answer = json.loads(row["extra"])["guide"]
    prompt = encoded(rollout, row, "z-1")
    scripts = [[call, answer],  # complete
               [call],  # its call is answered, then no turn is left for the answer
               [answer, answer],  # it answers at once: the second turn is never asked for
               [call, answer + " ".join(str(i) for i in range(400))],  # the answer outruns the turn's 96 tokens
               [call, call]]  # its second call passes max_tool_calls=1... and max_turns=2
    out, contexts = rollout.guide([prompt] * len(scripts), scripts, version=0)
    assert out["guide_complete"].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert [c.name for c in contexts] == ["z-1"] * len(scripts)
    assert [r["cut"] for r in out["episode"]] == [None, "turn_tokens", None, "turn_tokens", "max_turns"]


def test_guide_turns_come_from_the_row_s_guide_text_or_list_else_its_answer():
    assert guide_turns("red", {}) == ["<answer>red</answer>"]
    assert guide_turns("red", {"guide": "it is <answer>red</answer>"}) == ["it is <answer>red</answer>"]
    assert guide_turns("red", {"guide": ["call", "<answer>red</answer>"]}) == ["call", "<answer>red</answer>"]


def test_guidance_puts_each_all_wrong_group_s_guide_episode_in_its_last_row(rollout):
    rows = [zoom_row(seed, False) for seed in (7, 8)]
    extra = [json.loads(r["extra"]) for r in rows]
    extra[1]["guide"] = [extra[1]["guide"][0]]  # this group's guide stops after its call: not usable
    prompts = {f"u{i}": encoded(rollout, r, f"u{i}") for i, r in enumerate(rows)}
    asked: list[Batch] = []

    def episodes(batch: Batch) -> Batch:  # what the worker group's guide_episodes returns, run here in-process
        asked.append(batch)
        out, contexts = rollout.guide([prompts[u] for u in batch["uid"]], batch["guide_turns"], version=2)
        out.objects["context_key"] = [f"{u}#guide" for u in batch["uid"]]
        return out

    wide = rollout.loop.limits.max_tokens
    uids = ["u0"] * 3 + ["u1"] * 3
    batch = Batch(tensors={"responses": torch.ones(6, wide, dtype=torch.long), "response_mask": torch.ones(6, wide),
                           "policy_mask": torch.ones(6, wide), "rollout_log_probs": -torch.ones(6, wide),
                           "num_turns": torch.ones(6, dtype=torch.long),
                           "num_tool_calls": torch.zeros(6, dtype=torch.long),
                           "weight_version": torch.full((6,), 2)},
                  objects={"uid": uids, "answer": [rows[0]["answer"]] * 3 + [rows[1]["answer"]] * 3,
                           "extra": [extra[0]] * 3 + [extra[1]] * 3, "messages": [rows[0]["messages"]] * 6,
                           "images": [rows[0]["images"]] * 6, "response_text": ["wrong"] * 6,
                           "episode": [{"calls": []}] * 6, "context_key": [f"u{i // 3}#{i}" for i in range(6)]})

    def verify(b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        right = torch.tensor([float(extract_answer(t) == a) for t, a in zip(b["response_text"], b["answer"])])
        return right, right

    out, scores, correct, metrics = Guidance(lambda text: torch.tensor([0]), episodes).apply(
        batch, torch.zeros(6), torch.zeros(6), verify)
    # Asked by the prompt's uid (a sample's context key would name the episode it replaces, not the prompt).
    assert [b["uid"] for b in asked] == [["u0", "u1"]] and "context_key" not in asked[0].objects
    assert asked[0]["guide_turns"] == [extra[0]["guide"], extra[1]["guide"]]
    assert out[GUIDED].tolist() == [0, 0, 1, 0, 0, 0] and correct.tolist() == [0, 0, 1, 0, 0, 0]
    assert metrics == {"guide/groups": 0.5, "guide/rejected": 0.0, "guide/too_long": 1.0}
    assert out["context_key"] == ["u0#0", "u0#1", "u0#guide", "u1#3", "u1#4", "u1#5"]
    assert out["num_tool_calls"].tolist() == [0, 0, 1, 0, 0, 0] and out["episode"][2]["calls"][0]["name"] == "zoom_in"
    length = int(out["response_mask"][2].sum())
    assert 0 < out["policy_mask"][2].sum() < length and not out["response_mask"][2, length:].any()
    assert out["response_text"][2] == extra[0]["guide"][1] and out["response_text"][5] == "wrong"


def test_a_reward_model_scores_an_episode_on_its_whole_context_tool_images_included(rollout, tiny_model_dir):
    """The reward model's pass (what its worker runs on the contexts it is sent) against a plain transformers
    forward over each episode's whole context: the head on the hidden state of its last token."""
    rows = [zoom_row(seed, False) for seed in (11, 12)]
    scripts = [json.loads(r["extra"])["guide"] for r in rows]
    prompts = [encoded(rollout, r, f"r{i}") for i, r in enumerate(rows)]
    out, contexts = rollout.guide(prompts, scripts, version=0)
    policy = load_model(str(tiny_model_dir)).eval()
    reward_model = ValueModel.from_policy(policy).eval()
    torch.manual_seed(0)
    torch.nn.init.normal_(reward_model.value_head.weight, std=0.5)
    pad = rollout.processor.tokenizer.pad_token_id
    batch = Batch(tensors={"responses": out["responses"], "response_mask": out["response_mask"]},
                  objects={"prompt": contexts})
    with torch.no_grad():
        scores = sequence_scores(reward_model, batch, pad, torch.device("cpu"))
        for i, context in enumerate(contexts):
            length = int(out["response_mask"][i].sum())
            whole = dataclasses.replace(context, input_ids=torch.cat([context.input_ids, out["responses"][i, :length]]),
                                        mm_token_type_ids=torch.cat([context.mm_token_type_ids,
                                                                     context.response_mm_types]),
                                        response_mm_types=None)
            hidden = policy(**collate([whole], pad), output_hidden_states=True).hidden_states[-1][0, -1]
            assert torch.allclose(scores[i], reward_model.value_head(hidden).squeeze(), atol=1e-5)
        # The tool's image is read: the same episode with the zoomed image blanked scores otherwise.
        first = int(contexts[0].image_grid_thw[0].prod())  # the board's patches; the zoom's follow
        blank = dataclasses.replace(contexts[0], pixel_values=contexts[0].pixel_values.clone())
        blank.pixel_values[first:] = 0
        changed = sequence_scores(reward_model, Batch(tensors={k: v[:1] for k, v in batch.tensors.items()},
                                                      objects={"prompt": [blank]}), pad, torch.device("cpu"))
    assert not torch.allclose(changed[0], scores[0], atol=1e-4)
