"""The table of losses: one module per loss (or per family of two), each declaring one :class:`LossSpec`.

A spec holds the loss's function, its kind (a policy loss, or an extra loss an algorithm adds with a
coefficient), its own config section (``actor.loss.<name>``, which :mod:`mmrl.config` gathers from this table),
its settings, the batch fields it reads, whether it needs a sequence ``actor.loss_agg_mode`` and whether it is
linear in the advantage (the rollout correction needs that). The config, its checks (:mod:`mmrl.algos.checks`)
and the actor's update (:mod:`mmrl.workers.actor`) read only this table.

To add a loss, write one module here with its function, its section dataclass (bounded fields, one docstring
each) and its ``SPEC``, and add one line to :data:`LOSSES` (docs/algorithms.md#adding-a-loss)::

    # mmrl/algos/losses/scaled_pg.py
    @dataclass(kw_only=True)
    class ScaledPGConfig:
        scale: float = num(1.0, gt=0)  # with its docstring on the next line

    def scaled_pg_loss(logp, old_logp, advantages, mask, *, scale, agg_mode, denominator=None, horizon=None):
        ...  # (B, R) tensors -> (loss, metrics)

    SPEC = LossSpec("scaled_pg", scaled_pg_loss, section=ScaledPGConfig, linear=True,
                    settings=lambda actor, own: {"scale": own.scale, **agg_settings(actor)})

Its key is then ``actor.loss.scaled_pg.scale``, ``actor.loss.policy=scaled_pg`` chooses it, and docs/config.md
lists it after ``make docs``.

Every loss function takes (B, R) tensors whose ``mask`` marks the tokens the loss counts: the policy's own
tokens (:func:`mmrl.trajectory.policy_mask`), so that a tool's output and padding add nothing; a sequence's
length is its number of such tokens. Aggregation follows verl's names (:mod:`mmrl.algos.aggregation`).
"""

from __future__ import annotations

from mmrl.algos.losses import (
    cispo,
    clip_cov,
    dppo,
    dual_clip,
    gmpo,
    gpg,
    gspo,
    kl_cov,
    positive_lm,
    ppo_clip,
    sapo,
    sppo,
)
from mmrl.algos.losses.spec import LossSpec

LOSSES: dict[str, LossSpec] = {spec.name: spec for spec in (
    ppo_clip.SPEC,
    dual_clip.SPEC,
    gspo.SPEC,
    sppo.SPEC,
    cispo.SPEC,
    sapo.SPEC,
    gmpo.SPEC,
    gpg.SPEC,
    clip_cov.SPEC,
    kl_cov.SPEC,
    dppo.TV_SPEC,
    dppo.KL_SPEC,
    positive_lm.SPEC,
)}
"""Every loss by name, in the order of the config reference."""


def policy_losses() -> dict[str, LossSpec]:
    """The losses ``actor.loss.policy`` (or an algorithm's ``policy_loss``) may name."""
    return {name: spec for name, spec in LOSSES.items() if spec.kind == "policy"}


def extra_losses() -> dict[str, LossSpec]:
    """The losses an algorithm may add to its policy loss (``Algorithm.extra_losses``)."""
    return {name: spec for name, spec in LOSSES.items() if spec.kind == "extra"}


__all__ = ["LOSSES", "LossSpec", "extra_losses", "policy_losses"]
