"""The tiny model factory and the one encoding path (real transformers model, in-process)."""

import pytest
import torch
from PIL import Image

from mmrl.models.encoding import collate, encode_prompt, vision_token_ids
from mmrl.models.loading import load_model, load_processor
from mmrl.models.forward import PolicyForward
from mmrl.models.logprobs import policy_log_softmax, response_logprobs
from mmrl.models.scoring import Scoring, score_tokens
from mmrl.config import TinyModelConfig
from mmrl.models.families.qwen2_vl import SPECIAL_TOKENS, mrope_section
from mmrl.rollout.base import SamplingParams
from mmrl.rollout.hf import HFRolloutEngine

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model_and_processor(tiny_model_dir):
    return load_model(tiny_model_dir), load_processor(tiny_model_dir)


def square(rgb, size=56):
    return Image.new("RGB", (size, size), rgb)


def test_special_tokens_match_config(model_and_processor):
    model, processor = model_and_processor
    tok = processor.tokenizer
    assert all(tok.convert_tokens_to_ids(t) != tok.unk_token_id for t in SPECIAL_TOKENS)
    assert model.config.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert model.config.text_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert sum(mrope_section(TinyModelConfig(hidden_size=64, num_heads=4))) == 64 // 4 // 2


def test_encode_prompt_counts_image_tokens(model_and_processor):
    _, processor = model_and_processor
    enc = encode_prompt(processor, [{"role": "user", "content": "<image>What colour is the shape?"}], [square((255, 0, 0))])
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    # 56x56 -> grid (1, 4, 4) patches -> 4*4/merge^2 = 4 image tokens
    assert enc.image_grid_thw.tolist() == [[1, 4, 4]]
    assert int((enc.input_ids == image_id).sum()) == 4
    assert torch.equal(enc.mm_token_type_ids.bool(), enc.input_ids == image_id)


def test_placeholder_mismatch_is_a_clear_error(model_and_processor):
    _, processor = model_and_processor
    with pytest.raises(ValueError, match="1 <image> placeholders but 2 images"):
        encode_prompt(processor, [{"role": "user", "content": "<image>hi"}], [square((0, 0, 0))] * 2)


def test_collate_left_pads_prompts_and_appends_responses(model_and_processor):
    _, processor = model_and_processor
    long = encode_prompt(processor, [{"role": "user", "content": "<image>What colour is the shape?"}], [square((0, 0, 255))])
    short = encode_prompt(processor, [{"role": "user", "content": "hi"}], [])
    responses = torch.tensor([[7, 8, 0], [9, 0, 0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    batch = collate([long, short], pad_token_id=0, responses=responses, response_mask=mask)
    width = len(long)
    assert batch["input_ids"].shape == (2, width + 3)
    assert batch["attention_mask"][1, : width - len(short)].sum() == 0  # left padding
    assert batch["attention_mask"][0, width:].tolist() == [1, 1, 0]
    assert torch.equal(batch["pixel_values"], long.pixel_values)  # the text-only prompt adds no pixels
    assert batch["image_grid_thw"].shape == (1, 3)


def test_log_softmax_bans_tokens_and_entropy_matches_reference():
    logits = torch.tensor([[[1.0, 2.0, 3.0, 0.5]]])
    logp = policy_log_softmax(logits, banned_ids=[2], temperature=2.0)
    probs = torch.softmax(torch.tensor([0.5, 1.0, 0.25]), dim=-1)  # tokens 0, 1, 3 at temperature 2
    assert logp[0, 0, 2] == float("-inf")
    assert torch.allclose(logp[0, 0, [0, 1, 3]].exp(), probs)
    identity = torch.nn.Linear(4, 4, bias=False)  # the chunked scorer on the same logits
    torch.nn.init.eye_(identity.weight)
    with torch.no_grad():
        token_logp, entropy = score_tokens(logits[0], identity, torch.tensor([1]), Scoring(2.0, (2,), True))
    assert float(token_logp) == pytest.approx(float(probs[1].log()))
    assert float(entropy) == pytest.approx(float(-(probs * probs.log()).sum()))


def test_training_forward_logprobs_equal_rollout_logprobs(model_and_processor):
    """Generation and the training forward see the same inputs: log-probs agree (mixed text/image batch)."""
    model, processor = model_and_processor
    torch.manual_seed(0)
    prompts = [
        encode_prompt(processor, [{"role": "user", "content": "<image>What colour is the shape?"}], [square((200, 30, 30))]),
        encode_prompt(processor, [{"role": "user", "content": "How many shapes are there?"}], []),
        encode_prompt(processor, [{"role": "user", "content": "<image> and <image>?"}],
                      [square((0, 0, 200), 84), square((0, 200, 0), 56)]),
    ]
    engine = HFRolloutEngine(model, processor, CPU)
    out = engine.generate(prompts, SamplingParams(n=3, temperature=0.9, max_new_tokens=8))
    assert out.responses.shape == (9, 8)
    banned = set(vision_token_ids(processor))
    assert not any(int(t) in banned for t in out.responses[out.response_mask.bool()])
    expanded = [p for p in prompts for _ in range(3)]
    logp, _ = response_logprobs(PolicyForward(model), expanded, out.responses, out.response_mask, pad_token_id=engine.pad_id,
                                banned_ids=engine.banned_ids, temperature=0.9, device=CPU)
    assert float((logp - out.log_probs).abs().max()) < 1e-4


def test_response_stops_after_eos(model_and_processor):
    model, processor = model_and_processor
    engine = HFRolloutEngine(model, processor, CPU)
    eos, pad = engine.eos_id, engine.pad_id
    tokens = torch.tensor([[5, eos, 6, 7], [5, 6, 7, 8]])
    responses, mask = engine._pad_after_eos(tokens, 6)
    assert responses.tolist() == [[5, eos, pad, pad, pad, pad], [5, 6, 7, 8, pad, pad]]
    assert mask.tolist() == [[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
