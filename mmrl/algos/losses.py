"""Policy and value losses and KL estimators: pure functions returning ``(loss, metrics)``.

Every ``mask`` (B, R) here marks the tokens a loss counts: the policy's own tokens
(:func:`mmrl.trajectory.policy_mask`), not the attention extent, so that tokens the policy did not sample
(a tool's output) and padding both add nothing; a sequence's length is its number of such tokens.

Aggregation (``loss_agg_mode``) follows verl's names:
- ``token-mean``: sum over all valid tokens / number of valid tokens;
- ``seq-mean-token-sum``: per-sequence token sums, averaged over sequences;
- ``seq-mean-token-mean``: per-sequence token means, averaged over sequences;
- ``seq-mean-token-sum-norm`` (Dr. GRPO): per-sequence token sums, averaged over sequences and divided by
  a constant ``horizon`` (the maximum response length), so that no sequence's length scales its tokens.
A ``denominator`` replaces the local count (tokens or sequences), so that several micro-batches or
data-parallel ranks add up to the mean over the whole mini-batch.

Policy losses: PPO's clipped surrogate (asymmetric clip-higher with ``clip_low != clip_high``, and dual-clip
with ``clip_ratio_c``), GSPO (sequence-level ratio), SPPO (squared log-ratio regression onto win rates) and
VAPO's positive-example LM loss. ``POLICY_LOSSES`` maps ``actor.policy_loss`` names to functions of one
signature (:class:`PolicyLoss`); ``EXTRA_LOSSES`` maps the names of the losses an algorithm adds to its policy
loss (``Algorithm.extra_losses``) to functions of another (:class:`ExtraLoss`). A table loss that reads
per-sample batch fields beyond the common ones declares them in ``LOSS_FIELDS`` and gets each by keyword.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from mmrl.algos import losses_2025 as recent
from mmrl.algos.aggregation import aggregate
from mmrl.config import ActorConfig


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str = "token-mean",
    denominator: float | None = None,
    clip_ratio_c: float | None = None,
    horizon: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate, ``-min(ratio * A, clip(ratio, 1-low, 1+high) * A)``, aggregated.

    logp, old_logp, advantages, mask: (B, R). ``clip_low != clip_high`` gives DAPO's asymmetric clip-higher.
    With ``clip_ratio_c`` (> 1, dual-clip PPO) a negative-advantage token's loss is further capped at
    ``-A * clip_ratio_c``, so that a very large ratio cannot push its loss (and gradient) without bound;
    positive-advantage tokens are unchanged. ``denominator`` and ``horizon`` as in :func:`aggregate`.
    Returns the loss and metrics: ``pg_clipfrac`` (share of valid tokens where the clipped term was taken),
    ``ppo_kl`` (mean of old_logp - logp) and, with ``clip_ratio_c``, ``pg_clipfrac_lower`` (share of valid
    tokens where the dual-clip cap was taken).
    """
    if clip_ratio_c is not None and not clip_ratio_c > 1:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c
        negative = advantages < 0
        capped = negative & (per_token > cap)
        per_token = torch.where(negative, torch.minimum(per_token, cap), per_token)
    loss = aggregate(per_token, mask, agg_mode, denominator, horizon)
    valid = mask.sum().clamp(min=1)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": float(((clipped > unclipped).float() * mask).sum() / valid),
            "ppo_kl": float((-log_ratio * mask).sum() / valid),
        }
        if clip_ratio_c is not None:
            metrics["pg_clipfrac_lower"] = float((capped.float() * mask).sum() / valid)
    return loss, metrics


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str = "seq-mean-token-mean",
    denominator: float | None = None,
    horizon: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (GSPO-token form): PPO's clipped surrogate on a sequence-level importance ratio, aggregated.

    logp, old_logp, advantages, mask: (B, R). ``s_i = exp(mean over row i's valid tokens of
    (logp - old_logp))``; the token ratio ``s_it = sg[s_i] * exp(logp_t - sg[logp_t])`` has the value
    ``s_i`` and the gradient ``s_i * d logp_t`` (sg: stop-gradient), so per-token advantages weight each
    token's gradient. Per token: ``max(-A * s_it, -A * clip(s_it, 1-low, 1+high))``. Being a ratio of
    length-normalised likelihoods, ``s_i`` stays near 1: the clip range is narrow, typically
    ``clip_low=3e-4, clip_high=4e-4``. ``denominator`` and ``horizon`` as in :func:`aggregate`. Metrics:
    ``pg_clipfrac`` (share of valid tokens clipped, i.e. of tokens in clipped sequences when the advantage
    is constant along the row) and ``ppo_kl`` (mean of old_logp - logp over valid tokens).
    """
    log_ratio = logp - old_logp
    seq_log_ratio = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    ratio = torch.exp(seq_log_ratio.detach() + logp - logp.detach())
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = aggregate(per_token, mask, agg_mode, denominator, horizon)
    valid = mask.sum().clamp(min=1)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": float(((clipped > unclipped).float() * mask).sum() / valid),
            "ppo_kl": float((-log_ratio * mask).sum() / valid),
        }
    return loss, metrics


def sppo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    win_rates: torch.Tensor,
    mask: torch.Tensor,
    *,
    eta: float,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SPPO: regress each sequence's log-ratio on its centred win rate, ``(log_ratio_i - eta (P_i - 1/2))^2``.

    logp, old_logp, mask: (B, R); win_rates: (B,), the estimated probability that sample i beats the
    policy. ``log_ratio_i`` sums ``logp - old_logp`` over row i's valid tokens. Loss: sum over sequences /
    (B, or ``denominator``). Metrics, as means over valid tokens (a sequence weighs by its length):
    ``sppo_log_ratio`` (of log_ratio_i), ``sppo_target`` (of eta (P_i - 1/2)) and ``ppo_kl`` (of
    old_logp - logp).
    """
    if win_rates.shape != logp.shape[:1]:
        raise ValueError(f"win_rates must have shape ({logp.shape[0]},), got {tuple(win_rates.shape)}")
    log_ratio = ((logp - old_logp) * mask).sum(-1)
    target = eta * (win_rates - 0.5)
    per_seq = (log_ratio - target).square()
    count = denominator if denominator is not None else per_seq.shape[0]
    loss = per_seq.sum() / count
    lengths = mask.sum(-1)
    valid = lengths.sum().clamp(min=1)
    with torch.no_grad():
        metrics = {
            "sppo_log_ratio": float((log_ratio * lengths).sum() / valid),
            "sppo_target": float((target * lengths).sum() / valid),
            "ppo_kl": float((-log_ratio).sum() / valid),
        }
    return loss, metrics


def positive_lm_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    positive: torch.Tensor,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """VAPO's positive-example LM loss: the NLL of the tokens of positive (correct) samples only.

    logp, mask: (B, R); positive: (B,) bool. Token-mean over the positive samples' valid tokens, or
    divided by ``denominator`` (the global count of such tokens) when given; with no positive sample a
    zero that still carries ``logp``'s graph. Metrics, as means over all valid tokens: ``positive_token_frac``
    (share of tokens in positive samples) and ``positive_nll`` (-logp on those tokens, 0 elsewhere; divided
    by ``positive_token_frac`` it gives the NLL per positive token).
    """
    if positive.shape != logp.shape[:1]:
        raise ValueError(f"positive must have shape ({logp.shape[0]},), got {tuple(positive.shape)}")
    selected = mask * positive.to(mask.dtype).unsqueeze(-1)
    nll = -logp * selected
    count = denominator if denominator is not None else selected.sum().clamp(min=1)
    loss = nll.sum() / count
    valid = mask.sum().clamp(min=1)
    with torch.no_grad():
        metrics = {
            "positive_token_frac": float(selected.sum() / valid),
            "positive_nll": float(nll.sum() / valid),
        }
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_range: float,
    agg_mode: str = "token-mean",
    denominator: float | None = None,
    horizon: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss, ``0.5 * max((V - R)^2, (V_clip - R)^2)`` per token, aggregated.

    ``V_clip = old_values + clamp(values - old_values, -clip_range, clip_range)``. values, old_values,
    returns, mask: (B, R); old_values and returns are targets (detached), so the gradient flows only to
    values. ``denominator`` as in :func:`aggregate`. Metrics over the valid tokens: ``vf_clipfrac`` (share
    where the clipped term is strictly larger) and ``vpred_mean`` (mean of values).
    """
    old_values, returns = old_values.detach(), returns.detach()
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    unclipped_sq = (values - returns).square()
    clipped_sq = (clipped_values - returns).square()
    per_token = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    loss = aggregate(per_token, mask, agg_mode, denominator, horizon)
    valid = mask.sum().clamp(min=1)
    with torch.no_grad():
        metrics = {
            "vf_clipfrac": float(((clipped_sq > unclipped_sq).float() * mask).sum() / valid),
            "vpred_mean": float((values * mask).sum() / valid),
        }
    return loss, metrics


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens; (B, R) -> (B, R).

    k1: ``logp - ref``; k2: ``0.5 (logp - ref)^2``; k3 / low_var_kl: ``exp(ref - logp) - (ref - logp) - 1``
    (unbiased, non-negative; low_var_kl also clamps to [-10, 10] for stability); abs: ``|logp - ref|``.
    """
    diff = logp - ref_logp
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff.square()
    if estimator in ("k3", "low_var_kl"):
        neg = -diff
        if estimator == "low_var_kl":
            neg = neg.clamp(-20, 20)
        kl = torch.exp(neg) - neg - 1
        return kl.clamp(-10, 10) if estimator == "low_var_kl" else kl
    if estimator == "abs":
        return diff.abs()
    raise ValueError(f"unknown kl estimator {estimator!r}; allowed: k1, k2, k3, low_var_kl, abs")


def clip_settings(cfg: ActorConfig) -> dict[str, Any]:
    """The ``actor`` keys a clipped loss reads: the clip range, the aggregation mode and its horizon."""
    return {"clip_low": cfg.clip_ratio_low, "clip_high": cfg.clip_ratio_high, "agg_mode": cfg.loss_agg_mode,
            "horizon": cfg.loss_horizon}


def dual_clip_settings(cfg: ActorConfig) -> dict[str, Any]:
    """:func:`clip_settings` plus the dual-clip cap ``actor.clip_ratio_c``."""
    return {**clip_settings(cfg), "clip_ratio_c": cfg.clip_ratio_c}


def sppo_settings(cfg: ActorConfig) -> dict[str, Any]:
    """SPPO's one key, ``actor.sppo_eta``."""
    return {"eta": cfg.sppo_eta}


@dataclass(frozen=True)
class PolicyLoss:
    """An entry of :data:`POLICY_LOSSES`: a loss function and the keyword arguments it takes from ``actor``.

    ``policy_loss(logp, old_logp, advantages, mask, cfg=actor, denominator=d)`` calls
    ``loss(logp, old_logp, advantages, mask, denominator=d, **settings(actor))``.
    """

    loss: Callable[..., tuple[torch.Tensor, dict[str, float]]]
    settings: Callable[[ActorConfig], dict[str, Any]]

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        cfg: ActorConfig,
        denominator: float | None = None,
        **fields: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """logp, old_logp, advantages, mask: (B, R) -> (loss, metrics); ``mask``: the policy's own tokens. The
        fields :data:`LOSS_FIELDS` names for this loss come by keyword (``fields``).

        Every metric is a mean over the valid tokens of the batch given (the updater weights it by their
        number to average over micro-batches and ranks).
        """
        return self.loss(logp, old_logp, advantages, mask, denominator=denominator, **self.settings(cfg), **fields)


def sppo_on_win_rates(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eta: float,
    win_rates: torch.Tensor,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`sppo_loss` on the batch's ``win_rates`` (B,) (:mod:`mmrl.algos.sppo` computes them); the advantages
    are not read. logp, old_logp, mask: (B, R); ``denominator`` a sequence count (a sequence ``loss_agg_mode``:
    the loss is in :data:`POLICY_LOSS_NEEDS_SEQUENCE_AGG`).

    A row without a policy token (a dispatcher's padding copy) has no log-ratio to regress: its rate is taken
    as 1/2, a target of 0, so that it adds nothing to the loss.
    """
    win_rates = win_rates.to(logp.dtype).masked_fill(mask.sum(-1) == 0, 0.5)
    return sppo_loss(logp, old_logp, win_rates, mask, eta=eta, denominator=denominator)


ppo_clip = PolicyLoss(ppo_clip_loss, clip_settings)
dual_clip = PolicyLoss(ppo_clip_loss, dual_clip_settings)
# GSPO's clip range is ~1e-4 wide: set actor.clip_ratio_low/high accordingly (e.g. 3e-4 / 4e-4).
gspo = PolicyLoss(gspo_loss, clip_settings)
sppo = PolicyLoss(sppo_on_win_rates, sppo_settings)

POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo_clip": ppo_clip,
    "dual_clip": dual_clip,
    "gspo": gspo,
    "sppo": sppo,
    # The 2025-26 losses (mmrl.algos.losses_2025).
    "cispo": PolicyLoss(recent.cispo_loss, recent.cispo_settings),
    "sapo": PolicyLoss(recent.sapo_loss, recent.sapo_settings),
    "gmpo": PolicyLoss(recent.gmpo_loss, recent.gmpo_settings),
    "gpg": PolicyLoss(recent.gpg_loss, recent.gpg_settings),
    "clip_cov": PolicyLoss(recent.clip_cov_loss, recent.clip_cov_settings),
    "kl_cov": PolicyLoss(recent.kl_cov_loss, recent.kl_cov_settings),
    "dppo_tv": PolicyLoss(recent.dppo_loss, recent.dppo_tv_settings),
    "dppo_kl": PolicyLoss(recent.dppo_loss, recent.dppo_kl_settings),
}

POLICY_LOSS_NEEDS_SEQUENCE_AGG: frozenset[str] = frozenset({"sppo", "gmpo"})
"""The policy losses that are one term per sequence: their ``denominator`` is a sequence count, so they need a
sequence ``actor.loss_agg_mode`` (not token-mean)."""


class ExtraLoss(Protocol):
    def __call__(
        self,
        logp: torch.Tensor,
        mask: torch.Tensor,
        *,
        cfg: ActorConfig,
        denominator: float | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """logp, mask: (B, R) -> (loss, metrics), plus the fields :data:`LOSS_FIELDS` names for it, by keyword.

        ``denominator`` is the policy loss's, so that the loss adds up over micro-batches and ranks as the
        policy loss does; every metric is a mean over the valid tokens of the batch given.
        """
        ...


def positive_lm(
    logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    cfg: ActorConfig,
    denominator: float | None = None,
    correct: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """VAPO's :func:`positive_lm_loss` on the verified-correct samples: logp, mask (B, R), correct (B,) (1 where
    the verifier accepted the sample)."""
    return positive_lm_loss(logp, mask, correct.bool(), denominator)


EXTRA_LOSSES: dict[str, ExtraLoss] = {
    "positive_lm": positive_lm,
}

LOSS_FIELDS: dict[str, tuple[str, ...]] = {
    "sppo": ("win_rates",),
    "positive_lm": ("correct",),
}
"""The per-sample batch fields a loss of either table reads beyond logp, old log-probs, advantages and the mask;
the updater passes each to it by keyword. A loss not named here reads none."""
