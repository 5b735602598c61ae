"""The shared-prefill sampler (mmrl.rollout.sampler): greedy tokens equal transformers' ``generate``; the
log-probs equal the training forward's; top-k / top-p truncation against a plain reference."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from mmrl.models.encoding import collate, encode_prompt, vision_token_ids
from mmrl.models.forward import PolicyForward
from mmrl.models.loading import load_model, load_processor
from mmrl.models.logprobs import response_logprobs
from mmrl.rollout.sampler import LiveRows, draw, sample_shared_prefill, truncate
from mmrl.schema import Video

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    torch.manual_seed(0)
    model, processor = load_model(tiny_model_dir).eval(), load_processor(tiny_model_dir)
    colours = [(200, 30, 30), (30, 30, 200), (30, 200, 30), (200, 200, 30)]
    clip = Video([Image.new("RGB", (56, 56), c) for c in colours], [0.0, 0.5, 1.0, 1.5])
    prompts = [
        encode_prompt(processor, [{"role": "user", "content": "<image>What colour is the shape?"}],
                      [Image.new("RGB", (56, 84), colours[0])]),
        encode_prompt(processor, [{"role": "user", "content": "Name one."}], []),
        encode_prompt(processor, [{"role": "user", "content": "<image><video>First?"}],
                      [Image.new("RGB", (56, 56), colours[1])], [clip]),
    ]
    return model, processor, prompts


def run(model, processor, prompts, n, greedy, tokens=8, **kw):
    tok = processor.tokenizer
    args = {"max_new_tokens": tokens, "temperature": 0.8, "top_p": 1.0, "top_k": 0, "greedy": greedy,
            "banned_ids": vision_token_ids(processor), "eos_id": tok.eos_token_id, "pad_id": tok.pad_token_id,
            "device": CPU} | kw
    return sample_shared_prefill(model, prompts, n, **args)[:2]


def test_greedy_tokens_equal_transformers_generate(setup):
    """Left padding, an image, text only, and image + video: the same greedy tokens as ``generate``."""
    model, processor, prompts = setup
    tok = processor.tokenizer
    tokens, _ = run(model, processor, prompts, 2, greedy=True)
    inputs = collate(prompts, tok.pad_token_id)
    out = model.generate(**inputs, max_new_tokens=tokens.shape[1], do_sample=False, suppress_tokens=vision_token_ids(processor),
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    expected = out[:, inputs["input_ids"].shape[1]:]
    assert torch.equal(tokens[0::2], expected) and torch.equal(tokens[1::2], expected)


def test_sampled_log_probs_equal_the_training_forward(setup):
    """Sampled rows: the sampler's log-probs (temperature 0.8) equal the packed and the plain training forward's
    within 1e-5; padding after eos is zero."""
    model, processor, prompts = setup
    torch.manual_seed(3)
    tokens, logp = run(model, processor, prompts, 3, greedy=False)
    rows = [p for p in prompts for _ in range(3)]
    tok = processor.tokenizer
    is_eos = tokens == tok.eos_token_id
    mask = ((torch.cumsum(is_eos.long(), 1) - is_eos.long()) == 0).float()
    for share in (False, True):
        expected, _ = response_logprobs(PolicyForward(model), rows, tokens, mask, pad_token_id=tok.pad_token_id,
                                        banned_ids=vision_token_ids(processor), temperature=0.8, device=CPU,
                                        share_prompt=share)
        torch.testing.assert_close(logp * mask, expected.detach(), atol=1e-5, rtol=1e-5)
    assert (logp[mask == 0] == 0).all()


def test_truncation_against_a_plain_reference():
    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(5, 12), -1)
    logp[0, 3] = float("-inf")  # a banned token stays banned
    for top_k, top_p in ((0, 1.0), (3, 1.0), (0, 0.7), (4, 0.5), (1, 1.0), (0, 1e-6)):
        got = truncate(logp, top_k, top_p)
        for row in range(5):
            order = sorted(range(12), key=lambda i: -float(logp[row, i]))
            keep = set(order[:top_k]) if top_k else set(order)
            total, nucleus = 0.0, set()
            for i in order:
                if total >= top_p:
                    break
                nucleus.add(i)
                total += float(logp[row, i].exp())
            kept = keep & nucleus
            for i in range(12):
                expected = logp[row, i] if i in kept else float("-inf")
                assert float(got[row, i]) == float(expected), (top_k, top_p, row, i)


def count_narrowings(monkeypatch) -> list[int]:
    """The live rows' count after each narrowing of the decode batch."""
    seen: list[int] = []
    original = LiveRows._select

    def spy(self, index):
        original(self, index)
        seen.append(len(self.rows))

    monkeypatch.setattr(LiveRows, "_select", spy)
    return seen


def ends(tokens: torch.Tensor, eos_id: int) -> list[int | None]:
    return [int(row.nonzero()[0]) if row.any() else None for row in tokens == eos_id]


def test_rows_that_end_leave_the_batch_and_the_rest_decode_as_generate_does(setup, monkeypatch):
    """Greedy, the first prompt's rows ending early (the end token is the one its greedy row draws 4th): the batch
    narrows to the other prompts' rows and every row's tokens stay transformers'."""
    model, processor, prompts = setup
    tok = processor.tokenizer
    probe, _ = run(model, processor, prompts, 2, greedy=True, tokens=24)
    stop = int(probe[0, 3])
    narrowed = count_narrowings(monkeypatch)
    tokens, _ = run(model, processor, prompts, 2, greedy=True, tokens=24, eos_id=stop)
    inputs = collate(prompts, tok.pad_token_id)
    out = model.generate(**inputs, max_new_tokens=24, do_sample=False, suppress_tokens=vision_token_ids(processor),
                         eos_token_id=stop, pad_token_id=tok.pad_token_id)
    expected = torch.nn.functional.pad(out[:, inputs["input_ids"].shape[1]:], (0, 24), value=tok.pad_token_id)
    assert narrowed and len(set(ends(tokens, stop))) >= 2, (narrowed, ends(tokens, stop))
    assert torch.equal(tokens[0::2], expected[:, :tokens.shape[1]]) and torch.equal(tokens[1::2],
                                                                                     expected[:, :tokens.shape[1]])


def test_sampled_log_probs_after_the_batch_narrows_equal_the_training_forward(setup, monkeypatch):
    """48 sampled rows of 160 tokens (the random model ends a row about once in 310 tokens): rows end at many
    different steps, the batch narrows, and every token's log-prob equals the training forward's within 1e-5
    (positions, attention and cache rows stay each row's own)."""
    model, processor, prompts = setup
    tok = processor.tokenizer
    narrowed = count_narrowings(monkeypatch)
    torch.manual_seed(5)
    tokens, logp = run(model, processor, prompts, 16, greedy=False, tokens=160)
    ended = [e for e in ends(tokens, tok.eos_token_id) if e is not None]
    assert len(set(ended)) >= 8 and narrowed, (ended, narrowed)
    is_eos = tokens == tok.eos_token_id
    mask = ((torch.cumsum(is_eos.long(), 1) - is_eos.long()) == 0).float()
    rows = [p for p in prompts for _ in range(16)]
    expected, _ = response_logprobs(PolicyForward(model), rows, tokens, mask, pad_token_id=tok.pad_token_id,
                                    banned_ids=vision_token_ids(processor), temperature=0.8, device=CPU)
    torch.testing.assert_close(logp * mask, expected.detach(), atol=1e-5, rtol=1e-5)
    assert (logp[mask == 0] == 0).all()


def test_a_row_that_left_the_batch_keeps_its_context(setup, monkeypatch):
    """keep=True: every row that ended, whether it left the batch early or was there at the end, keeps the keys and
    values a fresh forward of its context and its turn (up to the end-of-turn token) gives, within 1e-5."""
    model, processor, prompts = setup
    tok = processor.tokenizer
    narrowed = count_narrowings(monkeypatch)
    torch.manual_seed(7)
    args = {"max_new_tokens": 160, "temperature": 0.8, "top_p": 1.0, "top_k": 0, "greedy": False,
            "banned_ids": vision_token_ids(processor), "eos_id": tok.eos_token_id, "pad_id": tok.pad_token_id,
            "device": CPU, "keep": True}
    out = sample_shared_prefill(model, prompts, 16, **args)
    assert narrowed and sum(k is not None for k in out.kept) >= 8, (narrowed, ends(out.tokens, tok.eos_token_id))
    for prompt, row, kept in zip([p for p in prompts for _ in range(16)], out.tokens, out.kept):
        eos = (row == tok.eos_token_id).nonzero()
        if len(eos) == 0:
            assert kept is None
            continue
        turn = row[: int(eos[0])]
        inputs = collate([prompt], tok.pad_token_id, turn[None], torch.ones(1, len(turn), dtype=torch.long))
        cache = model(**inputs, use_cache=True).past_key_values
        assert kept.length == inputs["input_ids"].shape[1]
        for layer, keys, values in zip(cache.layers, kept.keys, kept.values):
            torch.testing.assert_close(keys, layer.keys[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(values, layer.values[0], atol=1e-5, rtol=1e-5)


def test_draws_follow_the_truncated_distribution():
    """200,000 draws of one row: each token's frequency within 4.5 standard errors of its probability, with top-k
    keeping 3 of 5 tokens (renormalised by hand) and without truncation; a token outside the top-k never drawn."""
    probs = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    draws = 200_000
    torch.manual_seed(0)
    for top_k, expected in ((0, probs), (3, torch.tensor([0.0, 0.4, 0.0, 0.3, 0.15]) / 0.85)):
        tokens = draw(probs.log().expand(draws, -1), greedy=False, top_k=top_k, top_p=1.0)
        freq = torch.bincount(tokens, minlength=5).double() / draws
        stderr = (expected * (1 - expected) / draws).sqrt().double()
        assert ((freq - expected.double()).abs() <= 4.5 * stderr + 1e-12).all(), (top_k, freq, expected)
