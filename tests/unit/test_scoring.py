"""Chunked token scoring (mmrl.models.scoring) against the plain full-vocabulary computation: values and gradients
of the function itself, of response_logprobs on the tiny model (packed, unpacked, with holes), and the memory it
keeps: never a (tokens, vocabulary) tensor."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch.profiler import ProfilerActivity, profile

from mmrl.models.encoding import collate, encode_prompt
from mmrl.models.forward import PLACEHOLDER_MASK, PolicyForward, core_model
from mmrl.models.loading import load_model, load_processor
from mmrl.models.logprobs import response_logprobs
from mmrl.models.packing import pack
from mmrl.models.scoring import Scoring, chunk_size, score_tokens

CPU = torch.device("cpu")
BANNED = (2, 9)


def plain_scores(hidden, weight, bias, targets, banned, temperature):
    """The full-vocabulary computation: (N, V) logits at once, log-softmax, gather, entropy."""
    logits = F.linear(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    if banned:
        logits = logits.index_fill(-1, torch.tensor(banned), float("-inf"))
    log_probs = F.log_softmax(logits, -1)
    probs = log_probs.exp()
    entropy = -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(-1)  # banned: p = 0 adds nothing
    return log_probs.gather(-1, targets[:, None]).squeeze(-1), entropy


def problem(count: int, hidden_size: int = 6, vocab: int = 23, bias: bool = True, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(hidden_size, vocab, bias=bias).to(dtype)
    with torch.no_grad():  # logits of unit scale, as a trained head's are
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) / hidden_size**0.5)
        if bias:
            head.bias.copy_(torch.randn(vocab, generator=gen))
    hidden = torch.randn(count, hidden_size, generator=gen, dtype=dtype).requires_grad_()
    targets = torch.randint(0, vocab, (count,), generator=gen)
    weights = torch.randn(2, count, generator=gen, dtype=torch.promote_types(dtype, torch.float32))
    return head, hidden, targets, weights


def assert_close_to_scale(got: torch.Tensor, expected: torch.Tensor, tol: float = 1e-6) -> None:
    """|got - expected| <= tol x the largest |expected| (at least 1): float32 sums over the vocabulary cancel, so
    an entry's rounding is that of the largest terms, not of its own size."""
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    diff = float((got.double() - expected.double()).abs().max()) if got.numel() else 0.0
    assert got.shape == expected.shape and diff <= tol * scale, (diff, scale)


def grads_of(loss, head, hidden):
    params = [hidden, head.weight] + ([head.bias] if head.bias is not None else [])
    return torch.autograd.grad(loss, params)


@pytest.mark.parametrize("count", [0, 5, 37])
@pytest.mark.parametrize("chunk", [0, 1, 8, 64])
@pytest.mark.parametrize("bias", [True, False])
def test_chunked_scores_and_gradients_equal_the_full_vocabulary_ones(count, chunk, bias):
    """Chunks that divide N, that do not (37 by 8), a chunk larger than N, N = 0; banned ids, one of them a target
    (log-prob -inf, its loss weight 0, no NaN anywhere); temperature 0.7. Values and the gradients wrt the hidden
    states, the head's weight and bias, to 1e-6 (of the largest gradient entry)."""
    head, hidden, targets, (w_logp, w_ent) = problem(count, bias=bias)
    if count:
        targets[1], w_logp[1] = BANNED[0], 0.0
    scoring = Scoring(0.7, BANNED, with_entropy=True, chunk_tokens=chunk)
    logp, entropy = score_tokens(hidden, head, targets, scoring)
    ref_logp, ref_entropy = plain_scores(hidden, head.weight, head.bias, targets, BANNED, 0.7)
    assert logp.shape == entropy.shape == (count,) and logp.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-6, rtol=1e-6)
    if count:
        assert logp[1] == -torch.inf and torch.isfinite(entropy).all()
    finite = torch.isfinite(ref_logp)
    got = grads_of((w_logp * torch.where(finite, logp, 0)).sum() + (w_ent * entropy).sum(), head, hidden)
    expected = grads_of((w_logp * torch.where(finite, ref_logp, 0)).sum() + (w_ent * ref_entropy).sum(), head, hidden)
    for g, e in zip(got, expected):
        assert torch.isfinite(g).all()
        assert_close_to_scale(g, e)
    if count:
        assert bool(got[1][list(BANNED)].eq(0).all())  # banned rows of the head get no gradient


def test_without_entropy_the_log_prob_gradients_are_the_same():
    head, hidden, targets, (w_logp, _) = problem(11)
    logp, entropy = score_tokens(hidden, head, targets, Scoring(1.3, BANNED, with_entropy=False, chunk_tokens=4))
    assert entropy is None
    ref_logp, _ = plain_scores(hidden, head.weight, head.bias, targets, BANNED, 1.3)
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=1e-6)
    for g, e in zip(grads_of((w_logp * logp).sum(), head, hidden), grads_of((w_logp * ref_logp).sum(), head, hidden)):
        assert_close_to_scale(g, e)


def test_nothing_scored_still_gives_the_head_a_zero_gradient():
    """N = 0 (a rank whose micro-batch scores nothing): the weight gets zeros, not None, so a sharded head's
    reduction runs on every rank alike."""
    head, hidden, targets, _ = problem(0)
    logp, _ = score_tokens(hidden, head, targets, Scoring(1.0))
    logp.sum().backward()
    assert head.weight.grad is not None and not head.weight.grad.any() and not head.bias.grad.any()


def test_gradcheck_in_float64():
    head, hidden, targets, _ = problem(7, hidden_size=3, vocab=9, dtype=torch.float64, seed=1)
    targets = targets.masked_fill(targets == BANNED[0], 0)
    weight = head.weight.detach().clone().requires_grad_()
    bias = head.bias.detach().clone().requires_grad_()

    def scores(h, w, b):  # the head as any object with a weight and a bias
        head = SimpleNamespace(weight=w, bias=b)
        return score_tokens(h, head, targets, Scoring(0.7, BANNED[:1], with_entropy=True, chunk_tokens=3))

    assert scores(hidden, weight, bias)[0].dtype == torch.float64
    assert torch.autograd.gradcheck(scores, (hidden, weight, bias), eps=1e-6, atol=1e-7)


def test_bfloat16_heads_run_the_head_in_bfloat16_and_score_in_float32():
    head, hidden, targets, (w_logp, w_ent) = problem(10, hidden_size=16, vocab=40, dtype=torch.bfloat16)
    logp, entropy = score_tokens(hidden, head, targets, Scoring(0.9, BANNED, True, chunk_tokens=3))
    ref_logp, ref_entropy = plain_scores(hidden, head.weight, head.bias, targets, BANNED, 0.9)
    assert logp.dtype == entropy.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-6, rtol=1e-6)
    got = grads_of((w_logp * logp).sum() + (w_ent * entropy).sum(), head, hidden)
    expected = grads_of((w_logp * ref_logp).sum() + (w_ent * ref_entropy).sum(), head, hidden)
    for g, e in zip(got, expected):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g.float(), e.float(), atol=2e-2, rtol=2e-2)  # bf16 roundings of the chunk sums


def test_automatic_chunks_keep_float32_logits_within_128_mib():
    assert chunk_size(0, 151_936) == 220 and chunk_size(0, 151_936) * 151_936 * 4 <= 128 * 2**20
    assert chunk_size(0, 384) == 87_381 and chunk_size(5, 151_936) == 5
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunk_size(-1, 10)


# ---- on the tiny model ---------------------------------------------------------------------------------------

R = 6
ROWS = [(6, [2]), (6, [1, 4]), (5, []), (4, [0, 3]), (3, []), (6, [5]), (2, [])]  # (extent length, holes)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    torch.manual_seed(0)
    model, processor = load_model(tiny_model_dir, "float32", "sdpa", CPU), load_processor(tiny_model_dir)
    image = encode_prompt(processor, [{"role": "user", "content": "<image>What colour?"}],
                          [Image.new("RGB", (56, 56), (200, 30, 30))])
    text = encode_prompt(processor, [{"role": "user", "content": "Name a colour."}], [])
    prompts = [image] * 4 + [text] * 3
    gen = torch.Generator().manual_seed(1)
    extent = torch.tensor([[1.0] * n + [0.0] * (R - n) for n, _ in ROWS])
    policy = extent.clone()
    for b, (_, holes) in enumerate(ROWS):
        policy[b, holes] = 0.0
    pad = processor.tokenizer.pad_token_id
    responses = torch.randint(10, 300, extent.shape, generator=gen).masked_fill(extent == 0, pad)
    responses[1, 1] = BANNED[0]  # a hole holding a token the policy never samples
    weights = torch.randn(2, *extent.shape, generator=gen)
    return model, pad, prompts, responses, extent, policy, weights


def old_logprobs(model, prompts, responses, extent, policy, pad, share):
    """Yesterday's computation: full-vocabulary logits from Hugging Face's forward (on the packed rows too),
    float32 log-softmax at temperature 0.8 with the banned ids at -inf, gather, entropy; 0 off the policy's tokens."""
    if share:
        inputs = pack(core_model(model), prompts, responses, extent, pad)
        gather = inputs.pop("packed_gather")
        logits = model(**inputs, attention_mask=PLACEHOLDER_MASK, use_cache=False).logits[0][gather]
    else:
        logits = model(**collate(prompts, pad, responses, extent), use_cache=False).logits[:, -(R + 1) : -1]
    scaled = logits.float().index_fill(-1, torch.tensor(BANNED), float("-inf")) / 0.8
    log_probs = F.log_softmax(scaled, -1)
    probs = log_probs.exp()
    entropy = -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(-1)
    logp = log_probs.gather(-1, responses[..., None]).squeeze(-1)
    on = policy > 0
    return torch.where(on, logp, 0.0), torch.where(on, entropy, 0.0)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("chunk", [0, 5])
def test_response_logprobs_equal_the_full_vocabulary_forward_on_the_tiny_model(tiny, share, chunk):
    """Values to 1e-6 and every parameter's gradient to 1e-6 of its largest entry, packed and unpacked, with holes
    (one holding a banned token), chunks of 5 (not dividing the 26 scored tokens) and automatic."""
    model, pad, prompts, responses, extent, policy, (w_logp, w_ent) = tiny
    results = []
    for run in ("new", "old"):
        trained = copy.deepcopy(model)
        if run == "new":
            logp, entropy = response_logprobs(
                PolicyForward(trained), prompts, responses, extent, pad_token_id=pad, banned_ids=BANNED,
                temperature=0.8, device=CPU, share_prompt=share, policy_mask=policy, with_entropy=True,
                chunk_tokens=chunk)
        else:
            logp, entropy = old_logprobs(trained, prompts, responses, extent, policy, pad, share)
        ((w_logp * logp).sum() + (w_ent * entropy).sum()).backward()
        grads = {n: p.grad for n, p in trained.named_parameters() if p.grad is not None}
        results.append((logp.detach(), entropy.detach(), grads))
    (logp, entropy, grads), (ref_logp, ref_entropy, ref_grads) = results
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-6, rtol=1e-6)
    assert (logp[policy == 0] == 0).all() and (entropy[policy == 0] == 0).all()
    assert grads.keys() == ref_grads.keys() and any("visual" in n for n in grads) and any("lm_head" in n for n in grads)
    for name, grad in grads.items():
        assert_close_to_scale(grad, ref_grads[name])


# ---- memory ----------------------------------------------------------------------------------------------------


def peak_allocated(fn) -> int:
    """The peak of the bytes the CPU allocator holds while ``fn()`` runs, above what it held before, from the
    profiler's allocation events (allocations and frees in time order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def test_memory_stays_far_below_one_tokens_by_vocabulary_tensor():
    """V = 151,936: forward and backward through the scorer (entropy included) hold, beyond the head's own
    gradient, less than 1/8 of one float32 (N, V) tensor at their peak, and keep less than that for backward;
    the plain computation, measured the same way, holds several (N, V) tensors."""
    vocab, hidden_size, count = 151_936, 4, 128
    full = count * vocab * 4
    head, hidden, targets, (w_logp, w_ent) = problem(count, hidden_size=hidden_size, vocab=vocab, bias=False)
    saved: list[int] = []

    def chunked() -> None:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                      lambda t: t):
            logp, entropy = score_tokens(hidden, head, targets, Scoring(0.9, BANNED, True, chunk_tokens=2))
        ((w_logp * logp).sum() + (w_ent * entropy).sum()).backward()

    def plain(n: int) -> None:
        logp, entropy = plain_scores(hidden[:n], head.weight, None, targets[:n], BANNED, 0.9)
        ((w_logp[:n] * logp).sum() + (w_ent[:n] * entropy).sum()).backward()

    head_grad = vocab * hidden_size * 4
    peak = peak_allocated(chunked)
    assert sum(saved) < full / 8, sum(saved)  # the hidden states, the targets, the head, two (N,) vectors
    assert head.weight.grad is not None and peak - head_grad < full / 8, (peak, full)
    head.weight.grad = None
    assert peak_allocated(lambda: plain(16)) > 3 * 16 * vocab * 4  # the measurement sees (N, V) tensors
