"""mmrl.models.fused: the tiny model with its RMSNorms and SiLU gates as compiled kernels gives the eager model's
log-probs and gradients, for a training forward and a no-grad one; small tensors (a decode step's) stay eager."""

from __future__ import annotations

import copy
from collections import Counter

import torch

from mmrl.models import fused as fused_module
from mmrl.models.fused import GATED_MLPS, MIN_ELEMENTS, RMS_NORMS, fuse
from mmrl.models.loading import load_model


def test_fused_model_equals_the_eager_one(tiny_model_dir, monkeypatch):
    torch.manual_seed(0)
    eager = load_model(tiny_model_dir)
    fused = copy.deepcopy(eager)
    changed = fuse(fused)
    assert fuse(fused) == 0  # once per module
    layers = fused.model.language_model.layers
    for layer in layers:  # every decoder layer's norms and gated MLP
        assert all("forward" in vars(m) for m in (layer.input_layernorm, layer.post_attention_layernorm, layer.mlp))
    assert changed == sum("forward" in vars(m) for m in fused.modules()) >= 3 * len(layers) + 1
    assert all(type(m).__name__ in RMS_NORMS + GATED_MLPS for m in fused.modules() if "forward" in vars(m))
    calls: Counter[str] = Counter()
    for name, kernel in list(fused_module.KERNELS.items()):
        monkeypatch.setitem(fused_module.KERNELS, name, lambda *a, _k=kernel, _n=name: calls.update([_n]) or _k(*a))

    hidden = fused.config.text_config.hidden_size
    ids = torch.randint(10, 300, (8, MIN_ELEMENTS // (8 * hidden) + 8))  # every norm's input above the threshold
    for model in (eager, fused):
        model.zero_grad()
        logits = model(input_ids=ids).logits
        logits.log_softmax(-1).square().mean().backward()
        model.out = logits.detach()
    assert calls["rms_norm"] == 2 * len(layers) + 1 and calls["silu_gate"] == len(layers)
    torch.testing.assert_close(fused.out, eager.out, atol=1e-5, rtol=1e-5)
    grads = {n: p.grad for n, p in eager.named_parameters() if p.grad is not None}
    assert any("mlp" in n for n in grads) and any("norm" in n for n in grads)
    for name, param in fused.named_parameters():
        if name in grads:
            torch.testing.assert_close(param.grad, grads[name], atol=1e-6, rtol=1e-4, msg=name)
    calls.clear()
    with torch.no_grad():  # the rollout's path: another compiled graph, and a small input stays eager
        for batch in (ids, ids[:2, :4]):
            torch.testing.assert_close(fused(input_ids=batch).logits, eager(input_ids=batch).logits,
                                       atol=1e-5, rtol=1e-5)
    assert calls["rms_norm"] == 2 * len(layers) + 1  # the large batch only
