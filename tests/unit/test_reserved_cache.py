"""mmrl.rollout.reserved: a decode on reserved cache layers equals one on transformers' growing layers, token for
token, and writes in place (one buffer per layer until the batch is reordered)."""

from __future__ import annotations

import copy

import torch

from mmrl.models.loading import load_model
from mmrl.rollout.kept import keepable
from mmrl.rollout.reserved import ReservedLayer, reserve


def test_reserved_decode_equals_the_growing_cache(tiny_model_dir):
    model = load_model(tiny_model_dir).eval()
    torch.manual_seed(0)
    ids = torch.randint(10, 100, (3, 6))
    with torch.no_grad():
        plain = model(input_ids=ids, use_cache=True).past_key_values
    reserved = copy.deepcopy(plain)
    reserve(reserved, 4)
    assert all(type(layer) is ReservedLayer for layer in reserved.layers) and keepable(reserved)
    buffers = []
    for step in range(6):
        if step == 3:  # narrow the batch as the decode loop does when rows end: a new buffer, then in place again
            for cache in (plain, reserved):
                cache.reorder_cache(torch.tensor([0, 2]))
        token = torch.full((len(plain.layers[0].keys), 1), 20 + step)
        with torch.no_grad():
            a = model(input_ids=token, past_key_values=plain, use_cache=True).logits
            b = model(input_ids=token, past_key_values=reserved, use_cache=True).logits
        torch.testing.assert_close(b, a, rtol=0, atol=0)
        for mine, theirs in zip(reserved.layers, plain.layers):
            torch.testing.assert_close(mine.keys, theirs.keys, rtol=0, atol=0)
            torch.testing.assert_close(mine.values, theirs.values, rtol=0, atol=0)
        buffers.append(reserved.layers[0].key_buffer.data_ptr())
    assert buffers[0] == buffers[1] == buffers[2] and buffers[3] == buffers[4] == buffers[5] != buffers[0]
