"""Token scoring from the final hidden states, in chunks of tokens: the LM head's logits never exist for all
tokens at once.

For N scored tokens with hidden states (N, H), a head (V, H) and targets (N,), :func:`score_tokens` gives each
token's log-prob under the policy's distribution ``softmax(head(h) / temperature)`` with the banned tokens at
-inf, and optionally its entropy. It runs chunk by chunk (C tokens): the head in the model's dtype, then float32
(as a plain ``log_softmax(logits.float())`` would), temperature, banned ids, log-softmax, gather, entropy. Only
(C, V) logits exist at a time, and backward keeps only the hidden states, the targets, the head and two (N,)
vectors: each chunk's logits are recomputed there. Memory is O(C x V + N x H), never O(N x V).

Gradients (z the float32 scaled logits of one token, p = softmax(z), t the target, banned columns excluded):

    d logp_t / dz = onehot(t) - p
    d entropy / dz = -p * (log p + entropy)        (banned columns: 0)

then d/dlogits = d/dz / temperature, and the head's own backward gives the gradients of the hidden states, the
weight and the bias. The weight's gradient is accumulated chunk by chunk in the weight's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

AUTO_CHUNK_BYTES = 128 * 2**20
"""With ``chunk_tokens=0``: as many tokens per chunk as keep one chunk's float32 logits within 128 MiB (220 tokens
at V = 151,936). A chunk's working set is about three such buffers (logits, probabilities, gradient)."""


@dataclass(frozen=True)
class Scoring:
    """How the policy scores tokens: its temperature, the ids it can never sample, whether to compute the
    entropy, and the tokens per chunk (0: :data:`AUTO_CHUNK_BYTES`)."""

    temperature: float
    banned_ids: tuple[int, ...] = ()
    with_entropy: bool = False
    chunk_tokens: int = 0


def chunk_size(chunk_tokens: int, vocab: int) -> int:
    """Tokens per chunk: ``chunk_tokens``, or with 0 the most whose float32 logits fit in AUTO_CHUNK_BYTES."""
    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens={chunk_tokens}: give a positive number of tokens per chunk, or 0 for automatic")
    return chunk_tokens or max(1, AUTO_CHUNK_BYTES // (4 * vocab))


def chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float,
                 banned: torch.Tensor) -> torch.Tensor:
    """hidden (C, H) -> the scaled logits (C, V), at least float32, the ``banned`` (K,) int columns -inf."""
    logits = F.linear(hidden, weight, bias)
    scaled = logits.to(torch.promote_types(logits.dtype, torch.float32))  # a fresh tensor: scaled in place
    if temperature != 1.0:
        scaled = scaled.div_(temperature)
    return fill_columns(scaled, banned, float("-inf"))


def fill_columns(x: torch.Tensor, columns: torch.Tensor, value: float) -> torch.Tensor:
    """x (C, V) with ``columns`` (K,) int set to ``value``, in place."""
    return x.index_fill_(1, columns, value) if columns.numel() else x


class ChunkedTokenScore(torch.autograd.Function):
    """(hidden (N, H), weight (V, H), bias (V,) | None, targets (N,), banned (K,) int) -> logp (N,), entropy
    (N,) (or (0,) when not asked), in at least float32. Use :func:`score_tokens`."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, banned: torch.Tensor, temperature: float, with_entropy: bool,
                chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        count = hidden.shape[0]
        logp = hidden.new_empty(count, dtype=dtype)
        lse = hidden.new_empty(count, dtype=dtype)
        entropy = hidden.new_empty(count if with_entropy else 0, dtype=dtype)
        for start in range(0, count, chunk):
            rows = slice(start, start + chunk)
            z = chunk_logits(hidden[rows], weight, bias, temperature, banned)
            lse[rows] = torch.logsumexp(z, -1)
            logp[rows] = z.gather(1, targets[rows, None]).squeeze(1) - lse[rows]
            if with_entropy:
                log_probs = z.sub_(lse[rows, None])  # in place: z is not needed any more
                probs = log_probs.exp()
                # A banned token's probability is exactly 0: it adds nothing (0 * -inf would be NaN).
                entropy[rows] = -probs.mul_(fill_columns(log_probs, banned, 0.0)).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, banned, lse, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> tuple:
        hidden, weight, bias, targets, banned, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        # Always a gradient (zeros when nothing is scored): a sharded head then reduces on every rank alike.
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_bias = torch.zeros_like(bias) if need_bias else None
        grads = (grad_hidden, grad_weight, grad_bias, None, None, None, None, None)
        if grad_entropy is not None and grad_entropy.numel() == 0:  # no entropy was asked for
            grad_entropy = None
        if grad_logp is None and grad_entropy is None:
            return grads
        if grad_logp is None:
            grad_logp = torch.zeros_like(lse)
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            states = hidden[rows]
            z = chunk_logits(states, weight, bias, ctx.temperature, banned)
            entropy_part = None if grad_entropy is None else (entropy[rows], grad_entropy[rows])
            grad_z = logit_gradient(z, lse[rows], targets[rows], banned, grad_logp[rows], entropy_part)
            if ctx.temperature != 1.0:
                grad_z = grad_z.div_(ctx.temperature)
            grad_logits = grad_z.to(weight.dtype)
            if need_hidden:
                grad_hidden[rows] = grad_logits @ weight
            if need_weight:
                grad_weight.addmm_(grad_logits.T, states)
            if need_bias:
                grad_bias += grad_logits.sum(0)
        return grads


def logit_gradient(z: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, banned: torch.Tensor,
                   grad_logp: torch.Tensor,
                   entropy_part: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """The gradient (C, V) wrt the scaled logits ``z`` (C, V) (consumed in place) of ``sum(grad_logp * logp_t)``
    plus, with ``entropy_part`` = (entropy, grad_entropy), ``sum(grad_entropy * entropy)``; lse, targets and the
    grads (C,); the banned (K,) columns get 0.

    Per column j: ``grad_logp * ([j = t] - p_j) - grad_entropy * p_j * (log p_j + entropy)``.
    """
    log_probs = z.sub_(lse[:, None])
    probs = log_probs.exp()
    if entropy_part is None:
        grad = probs.mul_(-grad_logp[:, None])
    else:
        entropy, grad_entropy = entropy_part
        factor = fill_columns(log_probs, banned, 0.0).add_(entropy[:, None]).mul_(grad_entropy[:, None])
        grad = probs.mul_(factor.add_(grad_logp[:, None])).neg_()
    grad.scatter_add_(1, targets[:, None], grad_logp[:, None])
    return fill_columns(grad, banned, 0.0)  # banned logits are constants


def score_tokens(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor,
                 scoring: Scoring) -> tuple[torch.Tensor, torch.Tensor | None]:
    """hidden (N, H) states that predict ``targets`` (N,) int; head: the LM head (a Linear, (V, H) weight).

    Returns logp (N,) and, with ``scoring.with_entropy``, entropy (N,) (else None), float32 (float64 for a
    float64 model). Differentiable wrt the hidden states and the head's parameters.
    """
    weight, bias = head.weight, getattr(head, "bias", None)
    vocab = weight.shape[0]
    banned = torch.tensor(sorted(set(scoring.banned_ids)), dtype=torch.long, device=hidden.device)
    logp, entropy = ChunkedTokenScore.apply(hidden, weight, bias, targets.long(), banned, float(scoring.temperature),
                                            scoring.with_entropy, chunk_size(scoring.chunk_tokens, vocab))
    return logp, entropy if scoring.with_entropy else None
