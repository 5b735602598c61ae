"""What a loss of the table is: one :class:`LossSpec` per loss module, read by the config (its section), the
config checks (its kind, its aggregation, whether it is linear in the advantage) and the actor's update (its
function, its settings and the batch fields it reads)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

LossFunction = Callable[..., tuple[torch.Tensor, dict[str, float]]]


class ActorKeys(Protocol):
    """The ``actor`` keys a loss may read beside its own section (:class:`mmrl.config.ActorConfig` has them)."""

    clip_ratio_low: float
    clip_ratio_high: float
    loss_agg_mode: str
    loss_horizon: int
    loss: Any
    """The ``actor.loss`` section: ``loss.<name>`` is the section of the loss ``<name>``."""


def no_settings(actor: ActorKeys, own: Any) -> dict[str, Any]:
    """The settings of a loss that reads no key."""
    return {}


def agg_settings(actor: ActorKeys, own: Any = None) -> dict[str, Any]:
    """The aggregation a token-level loss reads: ``actor.loss_agg_mode`` and its horizon."""
    return {"agg_mode": actor.loss_agg_mode, "horizon": actor.loss_horizon}


def clip_settings(actor: ActorKeys, own: Any = None) -> dict[str, Any]:
    """The keys a clipped loss reads: the clip range ``actor.clip_ratio_low/high`` and the aggregation."""
    return {"clip_low": actor.clip_ratio_low, "clip_high": actor.clip_ratio_high, **agg_settings(actor)}


@dataclass(frozen=True)
class LossSpec:
    """One loss of the table, declared in its module.

    ``spec(*tensors, cfg=actor, denominator=d, **fields)`` calls ``function(*tensors, denominator=d,
    **settings(actor, actor.loss.<name>), **fields)``: the tensors are ``(logp, old_logp, advantages, mask)`` for
    a policy loss and ``(logp, mask)`` for an extra loss, each (B, R), ``mask`` the policy's own tokens; the
    fields are the batch fields of :attr:`fields`, by keyword. It returns ``(loss, metrics)``, every metric a
    mean over the valid tokens of the batch given (the updater weights it by their number to average over
    micro-batches and ranks); ``denominator`` is the global count the loss is divided by, so that its
    micro-batch values add up over micro-batches and ranks.
    """

    name: str
    """Its name in the table (``actor.loss.policy=<name>``); its section is ``actor.loss.<name>``."""
    function: LossFunction
    kind: Literal["policy", "extra"] = "policy"
    """``policy``: the policy loss (``actor.loss.policy``, or an algorithm's ``policy_loss``); ``extra``: a term an
    algorithm adds to its policy loss (``Algorithm.extra_losses``), weighted by its section's ``coef``."""
    section: type | None = None
    """Its own keys: a dataclass of bounded fields, ``actor.loss.<name>`` (None: it has none). A section set by
    the user is refused unless the run reads this loss."""
    settings: Callable[[ActorKeys, Any], dict[str, Any]] = no_settings
    """(the ``actor`` section, its own section or None) -> the keyword arguments of :attr:`function`."""
    fields: tuple[str, ...] = ()
    """The per-sample batch fields it reads beyond the tensors (e.g. SPPO's ``win_rates``); an algorithm whose
    losses read one must compute it (``Algorithm.loss_fields``)."""
    sequence_agg: bool = False
    """One term per sequence: its ``denominator`` is a sequence count, so it needs a sequence
    ``actor.loss_agg_mode`` (not token-mean)."""
    linear: bool = False
    """Each token's term scales with a positive factor on its advantage (``loss(w * A) = w * loss(A)`` token by
    token), so the rollout correction may weight the advantages (:mod:`mmrl.algos.rollout_correction`)."""

    def __post_init__(self) -> None:
        if self.name == "policy":
            raise ValueError("a loss cannot be named 'policy': actor.loss.policy is the key that chooses one")
        if self.kind == "extra" and (self.section is None
                                     or "coef" not in {f.name for f in dataclasses.fields(self.section)}):
            raise ValueError(f"the extra loss {self.name} needs a section with its coefficient, coef")

    def own(self, actor: ActorKeys) -> Any:
        """Its section of ``actor.loss`` (None when it has no section)."""
        return getattr(actor.loss, self.name) if self.section is not None else None

    def section_keys(self) -> tuple[str, ...]:
        """The dotted keys of its section, ``actor.loss.<name>.<key>``."""
        if self.section is None:
            return ()
        return tuple(f"actor.loss.{self.name}.{f.name}" for f in dataclasses.fields(self.section))

    def __call__(self, *tensors: torch.Tensor, cfg: ActorKeys, denominator: float | None = None,
                 **fields: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        return self.function(*tensors, denominator=denominator, **self.settings(cfg, self.own(cfg)), **fields)
