"""Reward models and judges without Ray: the Bradley-Terry loss, whole-sequence scores, the head's
checkpoint, the refusal of a reward model with another tokenizer, preference pairs, and the judge's prompt and
verdict."""

from __future__ import annotations

import json
import math

import pytest
import torch

from data_prep.preferences import broken_formats, synthetic_pairs, write_pairs
from mmrl.config import Config, TinyModelConfig, load_config
from mmrl.models.encoding import collate, encode_prompt
from mmrl.models.forward import ValueModel, core_model
from mmrl.models.loading import load_model, load_processor, save_checkpoint
from mmrl.models.tiny import build_tiny_vlm
from mmrl.trainer.preference_pairs import read_pairs
from mmrl.trainer.groups import check_same_tokenizer
from mmrl.trainer.rl import RLTrainer
from mmrl.trainer.rm import bradley_terry_loss, response_ids
from mmrl.workers.model_builder import build_model
from rewards import answer_match, format_reward
from pipelines.model import task_corpus
from rewards.judge import check_template, judge_messages, parse_verdict

CPU = torch.device("cpu")


def test_bradley_terry_loss_by_hand() -> None:
    chosen, rejected = torch.tensor([1.0, 0.0, 3.0]), torch.tensor([0.0, 2.0, 3.0])
    expected = (math.log(1 + math.exp(-1.0)) + math.log(1 + math.exp(2.0)) + math.log(2.0)) / 3
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(expected, rel=1e-6)


def _head(root: ValueModel, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        root.value_head.weight.copy_(torch.randn(root.value_head.weight.shape, generator=generator))
        root.value_head.bias.fill_(0.25)


def test_sequence_scores_read_the_last_real_response_token(tiny_model_dir) -> None:
    """Batched scores of right-padded responses of different lengths equal the head applied, one sample at a
    time without any padding, to the hidden state of the sample's last token."""
    model = load_model(tiny_model_dir).eval()
    root = ValueModel.from_policy(model)
    _head(root, 0)
    processor = load_processor(tiny_model_dir)
    tok = processor.tokenizer
    from PIL import Image

    prompt = encode_prompt(processor, [{"role": "user", "content": "<image>What colour is the shape?"}],
                           [Image.new("RGB", (56, 56), (200, 10, 10))])
    text_only = encode_prompt(processor, [{"role": "user", "content": "Say red."}], [])
    texts = ["<answer>red</answer>", "red", "<answer>blue"]
    targets = [response_ids(tok, t) for t in texts]
    width = max(len(t) for t in targets)
    ids = torch.full((3, width), tok.pad_token_id)
    mask = torch.zeros(3, width)
    for i, t in enumerate(targets):
        ids[i, : len(t)], mask[i, : len(t)] = t, 1
    prompts = [prompt, text_only, prompt]
    with torch.no_grad():
        batched = root.sequence_scores(collate(prompts, tok.pad_token_id, ids, mask), width, mask.sum(-1).long())
        core = core_model(model)
        for i in range(3):
            one = collate([prompts[i]], tok.pad_token_id, targets[i][None], torch.ones(1, len(targets[i])))
            hidden = core(**{k: v for k, v in one.items()}, use_cache=False).last_hidden_state[0, -1]
            expected = hidden @ root.value_head.weight[0] + 0.25
            assert batched[i].item() == pytest.approx(expected.item(), abs=1e-5)
    assert len(set(batched.tolist())) == 3


def test_a_reward_model_checkpoint_round_trips_through_the_builder(tiny_model_dir, tmp_path) -> None:
    model = load_model(tiny_model_dir)
    cfg = load_config(None, [f"model.path={tiny_model_dir}"])
    trainee = build_model(cfg, "rm_trainee", str(tiny_model_dir), device=CPU, distributed=False, model=model)
    assert trainee.root.backbone is core_model(model)  # the trainee trains the model it was given
    _head(trainee.root, 1)
    with torch.no_grad():
        core_model(model).language_model.norm.weight.mul_(1.5)  # the backbone changed by training
    path = save_checkpoint(model, load_processor(tiny_model_dir), tmp_path / "rm")
    trainee.root.save_head(path)
    loaded = build_model(cfg, "reward_model", str(path), device=CPU)
    assert torch.equal(loaded.root.value_head.weight, trainee.root.value_head.weight)
    assert torch.equal(loaded.root.core.language_model.norm.weight, core_model(model).language_model.norm.weight)
    assert not loaded.trainable() and not loaded.root.training
    with pytest.raises(FileNotFoundError, match="not a reward-model checkpoint.*make rm"):
        build_model(cfg, "reward_model", str(tiny_model_dir), device=CPU)


@pytest.mark.parametrize("other", ["fewer_tokens", "same_size_other_ids"])
def test_rl_refuses_a_reward_model_with_another_tokenizer_before_any_worker_starts(tiny_config, tmp_path, other):
    """A reward model reads the policy's token ids: RLTrainer refuses one whose vocabulary differs (fewer tokens,
    or as many tokens with other ids) in its constructor, before fit() starts any worker, naming the key and
    the fix."""
    policy = load_processor(tiny_config.trainer.init).tokenizer
    corpus = list(task_corpus(Config()))
    if other == "same_size_other_ids":  # the reversed texts give other merges, hence other ids
        corpus, size = [text[::-1] for text in corpus], len(policy)
    else:
        size = len(policy) - 64
    spec = TinyModelConfig(hidden_size=64, num_layers=1, intermediate_size=128, vision_hidden_size=32,
                           vision_heads=2, vocab_size=size)
    reward_model = build_tiny_vlm(corpus, spec, tmp_path / "other-rm")
    theirs = load_processor(reward_model).tokenizer
    assert (len(theirs) == len(policy)) == (other == "same_size_other_ids")
    assert theirs.get_vocab() != policy.get_vocab()
    check_same_tokenizer(tiny_config.trainer.init, tiny_config.trainer.init)  # the same one passes
    tiny_config.reward.model.path = str(reward_model)
    with pytest.raises(ValueError, match=rf"reward.model.path={reward_model} has a different tokenizer from the "
                                         r"policy .*train the reward model from the policy's checkpoint \(make rm, "
                                         r"rm.init\)"):
        RLTrainer(tiny_config)


ROWS = [{"id": f"r{i}", "answer": answer, "data_source": source}
        for i, (answer, source) in enumerate([("red", "colour"), ("blue", "colour"), ("green", "colour"),
                                              ("3", "count"), ("5", "count")])]


def test_synthetic_pairs_prefer_the_right_answer_in_the_trained_format() -> None:
    pairs = synthetic_pairs(ROWS, per_prompt=20, seed=0)
    assert pairs == synthetic_pairs(ROWS, per_prompt=20, seed=0) and pairs != synthetic_pairs(ROWS, 20, seed=1)
    assert len(pairs) == 100
    by_id = {r["id"]: r for r in ROWS}
    kinds = {p.kind for p in pairs}
    assert kinds == {"wrong_answer", "bad_format", "mangled"}
    for pair in pairs:
        row = by_id[pair.prompt_id]
        assert answer_match(pair.chosen, row["answer"]) == 1.0 and format_reward(pair.chosen) == 1.0
        if pair.kind == "mangled":
            assert answer_match(pair.rejected, row["answer"]) == 0.0 and pair.rejected.startswith("<answer>")
        elif pair.kind == "wrong_answer":
            assert answer_match(pair.rejected, row["answer"]) == 0.0 and format_reward(pair.rejected) == 1.0
            same_source = {r["answer"] for r in ROWS if r["data_source"] == row["data_source"]}
            assert pair.rejected[len("<answer>"):-len("</answer>")] in same_source
        else:  # a broken format, or one character of a tag edited: never a right answer in the right format
            assert answer_match(pair.rejected, row["answer"]) * format_reward(pair.rejected) == 0.0
            assert pair.rejected in broken_formats(row["answer"]) or len(pair.rejected) - len(pair.chosen) in (-1, 0, 1)


def test_pairs_files_round_trip_and_bad_lines_are_named(tmp_path) -> None:
    pairs = synthetic_pairs(ROWS, per_prompt=2, seed=0)
    path = write_pairs(tmp_path / "pairs.jsonl", pairs)
    ids = {r["id"] for r in ROWS}
    assert read_pairs(path, ids) == pairs
    cases = {
        "not json": "is not JSON",
        json.dumps({"prompt_id": "r0", "chosen": "a"}): "rejected missing",
        json.dumps({"prompt_id": "nope", "chosen": "a", "rejected": "b"}): "'nope' is not a row id",
        json.dumps({"prompt_id": "r0", "chosen": "a", "rejected": "a"}): "the same text",
    }
    for line, message in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({"prompt_id": "r1", "chosen": "x", "rejected": "y"}) + "\n" + line + "\n")
        with pytest.raises(ValueError, match=f"bad.jsonl:2.*{message}"):
            read_pairs(bad, ids)


@pytest.mark.parametrize("text, verdict", [
    ("yes", 1.0), ("Yes.", 1.0), (" YES, it is right", 1.0), ("<answer>correct</answer>", 1.0),
    ("no", 0.0), ("No!<|im_end|>", 0.0), ("Incorrect", 0.0), ("<answer> wrong </answer>", 0.0),
    ("maybe", None), ("", None), ("not sure", None), ("<answer>yes", None), ("12", None),
])
def test_parse_verdict(text: str, verdict: float | None) -> None:
    assert parse_verdict(text) == verdict


def test_judge_messages_keep_the_media_and_fill_the_template() -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "<image>Which is larger? <image> Answer in tags."}]
    out = judge_messages(messages, "<answer>left</answer>", "left", Config().reward.judge.template)
    assert len(out) == 1 and out[0]["role"] == "user"
    content = out[0]["content"]
    assert content.startswith("<image><image>Question: Which is larger? Answer in tags.\n")
    assert "Response: <answer>left</answer>" in content and "Reference answer: left" in content
    assert content.count("<image>") == 2


def test_check_template() -> None:
    check_template("Q: {question} A: {response}")
    with pytest.raises(ValueError, match="cannot be filled.*KeyError"):
        check_template("{question} {answer} {response}")
    with pytest.raises(ValueError, match="must contain \\{response\\}"):
        check_template("{question}")
