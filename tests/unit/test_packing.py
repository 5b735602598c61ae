"""Prompt sharing (mmrl.models.packing): one packed row per distinct prompt gives the plain forward's log-probs,
entropies and gradients, on mixed media, unequal prompt and response lengths, and prompts seen once."""

from __future__ import annotations

import copy

import pytest
import torch
from PIL import Image

from mmrl.models.encoding import encode_prompt
from mmrl.models.forward import PolicyForward
from mmrl.models.loading import load_model, load_processor
from mmrl.models.logprobs import response_logprobs
from mmrl.models.packing import Groups, attention_mask, pack, worth_packing
from mmrl.perf.text import text_costs
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
    assert worth_packing(model.config, rows, mask)  # the shared forward below packs
    plain = logprobs_and_grads(model, rows, responses, mask, processor, share=False)
    packed = logprobs_and_grads(model, rows, responses, mask, processor, share=True)
    torch.testing.assert_close(packed[0], plain[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1], plain[1], atol=1e-5, rtol=1e-5)
    assert (plain[0][mask == 0] == 0).all() and (packed[0][mask == 0] == 0).all()
    assert plain[2].keys() == packed[2].keys() and any("visual" in n for n in plain[2])
    for name in plain[2]:
        torch.testing.assert_close(packed[2][name], plain[2][name], atol=1e-5, rtol=1e-4, msg=name)


def test_pack_runs_each_prompt_once_and_gathers_the_right_states(model_and_processor, prompts):
    """Three samples of one prompt and one of another: two packed rows; the prompt's tokens appear once, each
    response only over its own extent; the state predicting token 0 is the prompt's last, token j > 0 the
    response's token j - 1."""
    model, processor = model_and_processor
    one, two, _, _ = prompts
    rows = [one, two, one, one]
    responses, mask = random_responses(processor, 4, 3, seed=2)
    mask = (torch.arange(3)[None] < torch.tensor([3, 2, 1, 2])[:, None]).float()  # each response its own extent
    responses = responses.masked_fill(mask == 0, processor.tokenizer.pad_token_id)
    packed = pack(model.model, rows, responses, mask, processor.tokenizer.pad_token_id)
    assert packed["input_ids"].shape == (2, max(len(one) + 3 + 1 + 2, len(two) + 2))
    assert packed["pixel_values"].shape[0] == one.pixel_values.shape[0] + two.pixel_values.shape[0]
    width = packed["input_ids"].shape[1]
    flat = packed["input_ids"].reshape(-1)
    for row in range(4):
        gather = packed["packed_gather"][row]
        extent = int(mask[row].sum())
        assert flat[gather[0]] == rows[row].input_ids[-1]
        assert torch.equal(flat[gather[1:extent]], responses[row, : extent - 1])
        assert gather[0] // width == (0 if rows[row] is one else 1)
    # Response positions continue from the prompt's largest position, as in the unpacked row.
    last = int(packed["position_ids"][:, 0].reshape(3, -1)[:, : width].max())
    assert last >= len(one) - 1


def test_attention_mask_by_hand():
    """segments: pad, prompt x2, response 1 x2 (second one padding), response 2 x1."""
    segment = torch.tensor([[-1, 0, 0, 1, 1, 2]])
    valid = torch.tensor([[False, True, True, True, False, True]])
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],  # padding sees itself only
        [0, 1, 0, 0, 0, 0],
        [0, 1, 1, 0, 0, 0],
        [0, 1, 1, 1, 0, 0],  # response 1 sees the prompt and itself
        [0, 1, 1, 1, 1, 0],  # its padding sees itself and what it would have seen
        [0, 1, 1, 0, 0, 1],  # response 2 never sees response 1
    ], dtype=torch.bool)
    assert torch.equal(attention_mask(segment, valid)[0, 0], expected)


def test_groups_keep_first_appearance_order():
    a, b, c = object(), object(), object()
    groups = Groups.of([b, a, b, c, a, b])
    assert groups.prompts == [b, a, c]
    assert groups.index == [0, 1, 0, 2, 1, 0]
    assert groups.slot == [0, 0, 1, 0, 1, 2]
    assert groups.sizes() == [3, 2, 1]


def test_packing_is_chosen_by_its_cost(model_and_processor, prompts):
    """Eight short responses to one image prompt pack (its tokens run once); eight long ones of unequal length do
    not (one row of 8 long responses costs more attention than 8 rows); a batch without a repeated prompt never
    packs. The choice is checked against the two layouts costed by hand."""
    model, _ = model_and_processor
    one = prompts[0]
    costs = text_costs(model.config)
    dense, pair = costs.dense, costs.pair

    def by_hand(extents):
        packed_row = len(one) + sum(extents)
        plain_row = len(one) + max(extents)
        return packed_row * dense + packed_row**2 * pair < 8 * (plain_row * dense + plain_row**2 * pair)

    for extents in ([2, 3, 1, 4, 2, 2, 3, 1], [400, 120, 900, 60, 300, 1000, 200, 500]):
        width = max(extents)
        mask = (torch.arange(width)[None] < torch.tensor(extents)[:, None]).float()
        assert worth_packing(model.config, [one] * 8, mask) == by_hand(extents)
    assert worth_packing(model.config, [one] * 8, (torch.arange(4)[None] < torch.tensor([2] * 8)[:, None]).float())
    assert not worth_packing(model.config, [one] * 8, (torch.arange(1000)[None] < torch.tensor(
        [400, 120, 900, 60, 300, 1000, 200, 500])[:, None]).float())
    assert not worth_packing(model.config, list(prompts), torch.ones(4, 2))
