"""Prompt sharing (mmrl.models.packing): one flat packed sequence of the distinct prompts and their responses gives
the plain forward's log-probs, entropies and gradients, on mixed media, unequal prompt and response lengths, and
prompts seen once; its attention (mmrl.models.packed_attention) equals dense attention under the mask drawn by
hand."""

from __future__ import annotations

import copy

import pytest
import torch
from PIL import Image

from mmrl.models.encoding import encode_prompt
from mmrl.models.forward import PolicyForward
from mmrl.models.loading import load_model, load_processor
from mmrl.models.logprobs import response_logprobs
from mmrl.models.packed_attention import PackedLayout, packed_attention
from mmrl.models.packing import Groups, pack, worth_packing
from mmrl.schema import Video

COLOURS = [(200, 30, 30), (30, 30, 200), (30, 200, 30), (200, 200, 30)]


@pytest.fixture(scope="module")
def model_and_processor(tiny_model_dir):
    torch.manual_seed(0)
    return load_model(tiny_model_dir, "float32", "sdpa", torch.device("cpu")), load_processor(tiny_model_dir)


@pytest.fixture(scope="module")
def prompts(model_and_processor):
    _, processor = model_and_processor
    one = encode_prompt(processor, [{"role": "user", "content": "<image>What colour is the shape?"}],
                        [Image.new("RGB", (56, 56), COLOURS[0])])
    two = encode_prompt(processor, [{"role": "user", "content": "<image><image>Same?"}],
                        [Image.new("RGB", (56, 56), COLOURS[1]), Image.new("RGB", (84, 56), COLOURS[2])])
    clip = Video([Image.new("RGB", (56, 56), c) for c in COLOURS], [0.0, 0.5, 1.0, 1.5])
    mixed = encode_prompt(processor, [{"role": "user", "content": "<image><video>First colour?"}],
                          [Image.new("RGB", (56, 84), COLOURS[3])], [clip])
    text = encode_prompt(processor, [{"role": "user", "content": "Name a colour."}], [])
    return one, two, mixed, text


def random_responses(processor, count: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(count, width) random non-vision tokens, right-padded to lengths in 1..width (one row of length 1)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = min(len(processor.tokenizer), 300)
    tokens = torch.randint(10, vocab, (count, width), generator=gen)
    lengths = torch.randint(1, width + 1, (count,), generator=gen)
    lengths[0] = 1
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    return tokens.masked_fill(mask == 0, processor.tokenizer.pad_token_id), mask


def logprobs_and_grads(model, rows, responses, mask, processor, share: bool):
    trained = copy.deepcopy(model)
    logp, entropy = response_logprobs(
        PolicyForward(trained), rows, responses, mask, pad_token_id=processor.tokenizer.pad_token_id,
        banned_ids=[], temperature=0.7, device=torch.device("cpu"), share_prompt=share, with_entropy=True)
    (logp.sum() + 0.1 * entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in trained.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), grads


@pytest.mark.parametrize("order", ["grouped", "interleaved"])
def test_packed_forward_equals_the_plain_forward(model_and_processor, prompts, order):
    """Log-probs and entropies to 1e-5, gradients to 1e-5 (abs) / 1e-4 (rel), padding rows zero; a prompt
    repeated 4 times, one repeated 3 times, and prompts that appear once (a group of one); one response empty."""
    model, processor = model_and_processor
    one, two, mixed, text = prompts
    rows = [one] * 4 + [two] * 3 + [mixed, text, text]
    if order == "interleaved":
        rows = [rows[i] for i in (0, 4, 7, 1, 8, 5, 2, 9, 3, 6)]
    responses, mask = random_responses(processor, len(rows), 6, seed=1)
    mask[2] = 0  # an empty response (a filler row's) packs to nothing
    responses[2] = processor.tokenizer.pad_token_id
    assert worth_packing(rows)  # the shared forward below packs
    plain = logprobs_and_grads(model, rows, responses, mask, processor, share=False)
    packed = logprobs_and_grads(model, rows, responses, mask, processor, share=True)
    torch.testing.assert_close(packed[0], plain[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1], plain[1], atol=1e-5, rtol=1e-5)
    assert (plain[0][mask == 0] == 0).all() and (packed[0][mask == 0] == 0).all()
    assert plain[2].keys() == packed[2].keys() and any("visual" in n for n in plain[2])
    for name in plain[2]:
        torch.testing.assert_close(packed[2][name], plain[2][name], atol=1e-5, rtol=1e-4, msg=name)


def test_pack_runs_each_prompt_once_and_gathers_the_right_states(model_and_processor, prompts):
    """Three samples of one prompt and one of another: one flat sequence without padding; each prompt's tokens
    appear once, each response only over its own extent; the state predicting token 0 is the prompt's last,
    token j > 0 the response's token j - 1."""
    model, processor = model_and_processor
    one, two, _, _ = prompts
    rows = [one, two, one, one]
    responses, mask = random_responses(processor, 4, 3, seed=2)
    extents = [3, 2, 1, 2]
    mask = (torch.arange(3)[None] < torch.tensor(extents)[:, None]).float()  # each response its own extent
    responses = responses.masked_fill(mask == 0, processor.tokenizer.pad_token_id)
    packed = pack(model.model, rows, responses, mask, processor.tokenizer.pad_token_id)
    assert packed["input_ids"].shape == (1, len(one) + len(two) + sum(extents))
    assert packed["pixel_values"].shape[0] == one.pixel_values.shape[0] + two.pixel_values.shape[0]
    flat, layout = packed["input_ids"][0], packed["packed_layout"]
    assert torch.equal(flat[: len(one)], one.input_ids) and torch.equal(layout.prompt_index[0, : len(one)],
                                                                      torch.arange(len(one)))
    for row in range(4):
        gather = packed["packed_gather"][row]
        group = 0 if rows[row] is one else 1
        assert layout.response_group[row] == group
        assert gather[0] == layout.prompt_index[group, len(rows[row]) - 1]
        assert flat[gather[0]] == rows[row].input_ids[-1]
        assert torch.equal(flat[gather[1 : extents[row]]], responses[row, : extents[row] - 1])
        assert torch.equal(flat[layout.response_index[row, : extents[row]]], responses[row, : extents[row]])
    # Responses in length buckets, longest first: extent 1 is under 2/3 of 3, so it is attended on its own.
    assert [(rows.tolist(), width) for rows, width in layout.buckets] == [([0, 1, 3], 3), ([2], 1)]
    # Every flat token comes back from its own gathered row: prompts' (G, P) rows first, then each bucket's.
    pieces = [torch.where(layout.prompt_keys, layout.prompt_index, -1).reshape(-1)]
    for bucket, width in layout.buckets:
        real = torch.arange(width)[None] < torch.tensor(extents)[bucket][:, None]
        pieces.append(torch.where(real, layout.response_index[bucket, :width], -1).reshape(-1))
    assert torch.equal(torch.cat(pieces)[layout.source], torch.arange(len(flat)))
    # Response positions continue from the prompt's largest position, as in the unpacked row.
    positions = packed["position_ids"].reshape(-1, len(flat))
    start = int(layout.response_index[0, 0])
    assert torch.equal(positions[:, start], positions[:, : len(one)].amax(1) + 1)


def test_layout_masks_by_hand():
    """Prompts of 2 and 1 tokens; responses: prompt 0's of extent 2 with a hole at 1, prompt 1's of 1, prompt 0's
    of 2. Flat: p0 p0 r0 r0 r2 r2 p1 r1."""
    layout = PackedLayout(
        prompt_index=torch.tensor([[0, 1], [6, 0]]), prompt_keys=torch.tensor([[True, True], [True, False]]),
        response_index=torch.tensor([[2, 3], [7, 0], [4, 5]]),
        response_keys=torch.tensor([[True, False], [True, False], [True, True]]),
        response_group=torch.tensor([0, 1, 0]), source=torch.tensor([0, 1, 4, 5, 8, 9, 2, 6]))
    prompts, responses = layout.masks()
    assert torch.equal(prompts[:, 0].int(), torch.tensor([[[1, 0], [1, 1]], [[1, 0], [1, 1]]]))  # a pad query sees itself
    assert torch.equal(responses[:, 0].int(), torch.tensor([
        [[1, 1, 1, 0], [1, 1, 1, 1]],  # the hole is no key, but sees itself
        [[1, 0, 1, 0], [1, 0, 1, 1]],  # prompt 1 has one token (its pad is no key)
        [[1, 1, 1, 0], [1, 1, 1, 1]],
    ]))


@pytest.mark.parametrize("bucketed", [False, True])
@pytest.mark.parametrize("kv_heads", [2, 4])
def test_packed_attention_equals_dense_attention_under_the_hand_mask(kv_heads, bucketed):
    """Random queries, keys and values over the flat sequence of test_layout_masks_by_hand: every real token's
    output and the gradients equal softmax attention over an (N, N) mask written from the segments; with the
    responses in one bucket (gathered rows p0 p0 p1 pad r0 r0 r1 pad r2 r2) or two, r0 and r2 at width 2 then r1 at
    width 1 (p0 p0 p1 pad r0 r0 r2 r2 r1)."""
    buckets = ((torch.tensor([0, 2]), 2), (torch.tensor([1]), 1)) if bucketed else ()
    source = [0, 1, 4, 5, 6, 7, 2, 8] if bucketed else [0, 1, 4, 5, 8, 9, 2, 6]
    layout = PackedLayout(
        prompt_index=torch.tensor([[0, 1], [6, 0]]), prompt_keys=torch.tensor([[True, True], [True, False]]),
        response_index=torch.tensor([[2, 3], [7, 0], [4, 5]]),
        response_keys=torch.tensor([[True, False], [True, False], [True, True]]),
        response_group=torch.tensor([0, 1, 0]), source=torch.tensor(source), buckets=buckets)
    segment = ["p0", "p0", "r0", "r0", "r2", "r2", "p1", "r1"]
    is_key = [True, True, True, False, True, True, True, True]  # token 3 is the hole
    prompt_of = {"r0": "p0", "r2": "p0", "r1": "p1"}
    allowed = torch.zeros(8, 8, dtype=torch.bool)
    for q in range(8):
        for k in range(8):
            same = segment[k] == segment[q] and k <= q
            context = segment[k] == prompt_of.get(segment[q])
            allowed[q, k] = k == q or (is_key[k] and (same or context))
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 8, 5, generator=gen, requires_grad=True)
    k = torch.randn(1, kv_heads, 8, 5, generator=gen, requires_grad=True)
    v = torch.randn(1, kv_heads, 8, 5, generator=gen, requires_grad=True)
    out = packed_attention(torch.nn.Module(), q, k, v, layout, scaling=0.3)  # (1, N, h, d)
    repeat = 4 // kv_heads
    scores = (q[0] @ k[0].repeat_interleave(repeat, 0).transpose(1, 2)) * 0.3
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    expected = (probs @ v[0].repeat_interleave(repeat, 0)).transpose(0, 1)[None]
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    weights = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert layout.calls == 1


def test_length_buckets_cut_under_two_thirds_of_the_bucket_s_longest():
    from mmrl.models.packed_attention import length_buckets

    extents = torch.tensor([5, 256, 30, 200, 171, 0, 256, 100])
    got = [(rows.tolist(), width) for rows, width in length_buckets(extents)]
    # 256 256 200 171 | 100 | 30 | 5 | 0: 171 >= 2/3 * 256 > 100, 30 < 2/3 * 100, 5 < 20, 0 < 10/3 (width 1)
    assert got == [([1, 6, 3, 4], 256), ([7], 100), ([2], 30), ([0], 5), ([5], 1)]
    assert [(rows.tolist(), width) for rows, width in length_buckets(torch.tensor([16, 15, 12, 16]))] == [
        ([0, 3, 1, 2], 16)]


def test_groups_keep_first_appearance_order():
    a, b, c = object(), object(), object()
    groups = Groups.of([b, a, b, c, a, b])
    assert groups.prompts == [b, a, c]
    assert groups.index == [0, 1, 0, 2, 1, 0]
    assert groups.slot == [0, 0, 1, 0, 1, 2]
    assert groups.sizes() == [3, 2, 1]


def test_packing_is_chosen_when_a_prompt_repeats(prompts):
    """A repeated prompt packs, long unequal responses too (the flat layout never costs more than rows); a batch
    without a repeated prompt runs plain."""
    one = prompts[0]
    assert worth_packing([one] * 8)
    assert worth_packing([one, prompts[1], one])
    assert not worth_packing(list(prompts))
