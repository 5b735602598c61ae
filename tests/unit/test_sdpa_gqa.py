"""mmrl.patches.sdpa_gqa: grouped-query attention on CPU with a mask, without copying the key and value heads,
equals the repeated heads' attention forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.integrations import sdpa_attention

from mmrl.patches import sdpa_gqa


class Module(torch.nn.Module):
    num_key_value_groups = 2
    is_causal = True


def repeated(x: torch.Tensor, groups: int) -> torch.Tensor:
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def test_gqa_with_a_mask_equals_repeated_heads_forward_and_backward():
    sdpa_gqa.apply()
    torch.manual_seed(0)
    q = torch.randn(3, 4, 5, 8, requires_grad=True)
    k = torch.randn(3, 2, 7, 8, requires_grad=True)
    v = torch.randn(3, 2, 7, 8, requires_grad=True)
    mask = torch.rand(3, 1, 5, 7) > 0.3
    mask[..., 0] = True  # every query attends to something
    assert sdpa_attention.use_gqa_in_sdpa(mask, k, v)
    out, _ = sdpa_attention.sdpa_attention_forward(Module(), q, k, v, mask)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    reference = F.scaled_dot_product_attention(q, repeated(k, 2), repeated(v, 2), attn_mask=mask).transpose(1, 2)
    reference_grads = torch.autograd.grad(reference.square().sum(), (q, k, v))
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-6)
    for got, want in zip(grads, reference_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_other_devices_keep_transformers_rule():
    """Off the CPU the original decides: no GQA kernel with a mask (a meta tensor stands for another device)."""
    sdpa_gqa.apply()
    k = torch.empty(1, 2, 3, 8, device="meta")
    assert not sdpa_attention.use_gqa_in_sdpa(torch.ones(1, 1, 1, 3, dtype=torch.bool, device="meta"), k, k)
    assert sdpa_attention.use_gqa_in_sdpa(None, k, k)


@pytest.mark.parametrize("kv_heads", [2, 4])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
def test_one_query_token_on_the_cpu_is_the_repeated_heads_softmax_attention(kv_heads, mask_kind):
    """A decode step (one query token, 4 query heads on ``kv_heads`` key heads, a per-row mask) equals softmax
    attention written out over the repeated heads, and is what transformers' registered ``sdpa`` function runs."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa_gqa.apply()
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_gqa.sdpa_attention
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 1, 8), torch.randn(3, kv_heads, 7, 8), torch.randn(3, kv_heads, 7, 8)
    keep = torch.rand(3, 1, 1, 7) > 0.3
    keep[..., -1] = True
    mask = {"bool": keep, "additive": torch.zeros(3, 1, 1, 7).masked_fill(~keep, -1e9), "none": None}[mask_kind]
    out, _ = sdpa_gqa.sdpa_attention(Module(), q, k, v, mask, scaling=0.5)
    groups = 4 // kv_heads
    scores = q @ repeated(k, groups).transpose(-1, -2) * 0.5
    if mask is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    reference = (scores.softmax(-1) @ repeated(v, groups)).transpose(1, 2)
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-6)
