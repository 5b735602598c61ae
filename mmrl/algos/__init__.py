"""RL algorithms as objects, the losses they name, and the helpers that read both tables.

``ALGORITHMS`` (:mod:`mmrl.algos.table`) maps ``algorithm.name`` to an :class:`~mmrl.algos.base.Algorithm`
subclass; the driver and the config checks read only its declarations (critic, group size, policy loss, extra
losses, the fields its losses read, the common keys it reads, its own config section, its own config check) and
call its hooks (collection, extra rollouts, whether the actor trains this step, advantages). To add an
algorithm, write one module here with a subclass and add one line to the table, e.g.::

    # mmrl/algos/mean_baseline.py: the group's mean as the baseline, no std
    from mmrl.algos.base import OutcomeAlgorithm
    from mmrl.algos.groups import group_stats

    class MeanBaseline(OutcomeAlgorithm):
        min_group_size = 2  # rollout.n=1 is refused at load

        def outcome_advantages(self, scores, uids):  # scores (B,) -> advantages (B,)
            _, mean, _ = group_stats(scores, uids)
            return scores - mean

    # mmrl/algos/table.py
    ALGORITHMS = {..., "mean_baseline": MeanBaseline}

An algorithm's own keys are a dataclass it names as its ``section`` (``algorithm.<name>.<key>``: see
:mod:`mmrl.algos.pass_at_k`). A loss is one module of :mod:`mmrl.algos.losses` plus one line in its ``LOSSES``; an
extra loss an algorithm adds is named in the algorithm's ``extra_losses``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from mmrl.algos.actor_loss import ActorLoss
from mmrl.algos.base import Algorithm, OutcomeAlgorithm, RolloutContext
from mmrl.algos.losses import LOSSES, LossSpec
from mmrl.algos.table import ALGORITHMS

if TYPE_CHECKING:
    from mmrl.config import Config


def build_algorithm(cfg: Config) -> Algorithm:
    """The algorithm ``algorithm.name`` names (validated at config load)."""
    return ALGORITHMS[cfg.algorithm.name](cfg.algorithm)


def needs_reference(cfg: Config) -> bool:
    """Whether the run needs the reference policy: a KL loss, or a KL penalty in the reward."""
    return cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


def policy_loss(cfg: Config) -> ActorLoss:
    """The terms of the actor's loss from the loss table: the policy loss (``actor.loss.policy`` when set, else
    the algorithm's own) and the algorithm's extra losses with their coefficients (``actor.loss.<name>.coef``;
    those at 0 left out).

    Raises ValueError when a term reads a batch field the algorithm does not give (:func:`check_loss_fields`).
    """
    algorithm = ALGORITHMS[cfg.algorithm.name]
    coefficients = ((name, float(getattr(cfg.actor.loss, name).coef)) for name in algorithm.extra_losses)
    loss = ActorLoss(cfg.actor.loss.policy or algorithm.policy_loss, tuple((n, c) for n, c in coefficients if c))
    check_loss_fields(cfg.algorithm.name, loss)
    return loss


def check_loss_fields(algorithm_name: str, loss: ActorLoss) -> None:
    """Raise ValueError when a loss term reads a per-sample field that the algorithm's ``loss_fields`` lacks
    (e.g. the sppo policy loss, which reads SPPO's ``win_rates``, under grpo)."""
    given = ALGORITHMS[algorithm_name].loss_fields
    missing = [field for field in loss.fields if field not in given]
    if missing:
        givers = sorted(name for name, cls in ALGORITHMS.items() if set(missing) <= set(cls.loss_fields))
        raise ValueError(
            f"actor.loss.policy={loss.policy} reads {', '.join(missing)}, which algorithm.name={algorithm_name} "
            f"does not compute; use algorithm.name={' or '.join(givers) or '(none computes it)'}, or another "
            "actor.loss.policy")


def section_keys(name: str) -> tuple[str, ...]:
    """The dotted keys of the algorithm ``name``'s own section, ``algorithm.<name>.<key>`` (none without one)."""
    section = ALGORITHMS[name].section
    return tuple(f"algorithm.{name}.{f.name}" for f in dataclasses.fields(section)) if section else ()


def key_owners() -> dict[str, list[str]]:
    """Each config key that some algorithms own -> their names, in table order: the common keys each reads and
    its extra losses' keys (:meth:`Algorithm.owned_keys`), and its own section's keys (:func:`section_keys`)."""
    owners: dict[str, list[str]] = {}
    for name, cls in ALGORITHMS.items():
        for key in (*cls.owned_keys(), *section_keys(name)):
            owners.setdefault(key, []).append(name)
    return owners


def check_key_ownership(algorithm_name: str, given: Iterable[str]) -> None:
    """Raise ValueError when a dotted key of ``given`` (the keys the user set) belongs to other algorithms than
    ``algorithm_name``: such a key would be silently ignored. The message names each key, its owners and the fix."""
    owners = key_owners()
    foreign = sorted(key for key in set(given) if key in owners and algorithm_name not in owners[key])
    if foreign:
        each = "; ".join(f"{key} belongs to {', '.join(owners[key])}" for key in foreign)
        them = "it" if len(foreign) == 1 else "them"
        raise ValueError(f"{each}: algorithm.name={algorithm_name} does not read {them}; remove {them}, or set "
                         "algorithm.name to an owner")


def critic_algorithms() -> list[str]:
    """The names of the algorithms that train a critic (``needs_critic``), in table order."""
    return [name for name, cls in ALGORITHMS.items() if cls.needs_critic]


__all__ = ["ALGORITHMS", "LOSSES", "ActorLoss", "Algorithm", "LossSpec", "OutcomeAlgorithm", "RolloutContext",
           "build_algorithm", "check_key_ownership", "check_loss_fields", "critic_algorithms", "key_owners",
           "needs_reference", "policy_loss", "section_keys"]
