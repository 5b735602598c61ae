"""RL algorithms as objects, and the policy losses they name.

``ALGORITHMS`` maps ``algorithm.name`` to an :class:`~mmrl.algos.base.Algorithm` subclass; the driver and the
config checks read only its declarations (critic, group size, policy loss, extra losses, the fields its losses
read, the config keys it owns) and call its hooks (collection, extra rollouts, whether the actor trains this
step, advantages). To add an algorithm, write one module here with a subclass and add one entry to the
table, e.g.::

    # mmrl/algos/mean_baseline.py: the group's mean as the baseline, no std
    from mmrl.algos.base import OutcomeAlgorithm
    from mmrl.algos.groups import group_stats

    class MeanBaseline(OutcomeAlgorithm):
        min_group_size = 2  # rollout.n=1 is refused at load

        def outcome_advantages(self, scores, uids):  # scores (B,) -> advantages (B,)
            _, mean, _ = group_stats(scores, uids)
            return scores - mean

    # here
    ALGORITHMS = {..., "mean_baseline": MeanBaseline}

A new policy loss is one function in :mod:`mmrl.algos.losses` plus one entry in ``POLICY_LOSSES``; a loss an
algorithm adds to it is one entry in ``EXTRA_LOSSES`` and one in the algorithm's ``extra_losses``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mmrl.algos.actor_loss import ActorLoss
from mmrl.algos.base import Algorithm, OutcomeAlgorithm, RolloutContext
from mmrl.algos.dapo import DAPO
from mmrl.algos.dr_grpo import DrGRPO
from mmrl.algos.grpo import GRPO
from mmrl.algos.gspo import GSPO
from mmrl.algos.losses import POLICY_LOSSES, PolicyLoss
from mmrl.algos.opo import OPO
from mmrl.algos.pass_at_k import PassAtK
from mmrl.algos.pf_ppo import PFPPO
from mmrl.algos.ppo import PPO
from mmrl.algos.reinforce_pp import ReinforcePP, ReinforcePPBaseline
from mmrl.algos.remax import ReMax
from mmrl.algos.rloo import RLOO
from mmrl.algos.sppo import SPPO
from mmrl.algos.vapo import VAPO
from mmrl.config import Config

ALGORITHMS: dict[str, type[Algorithm]] = {
    "grpo": GRPO,
    "dr_grpo": DrGRPO,
    "rloo": RLOO,
    "ppo": PPO,
    "reinforce_plus_plus": ReinforcePP,
    "reinforce_plus_plus_baseline": ReinforcePPBaseline,
    "remax": ReMax,
    "dapo": DAPO,
    "gspo": GSPO,
    "vapo": VAPO,
    "pf_ppo": PFPPO,
    "sppo": SPPO,
    "grpo_pass_k": PassAtK,
    "opo": OPO,
}


def build_algorithm(cfg: Config) -> Algorithm:
    """The algorithm ``algorithm.name`` names (validated at config load)."""
    return ALGORITHMS[cfg.algorithm.name](cfg.algorithm)


def needs_reference(cfg: Config) -> bool:
    """Whether the run needs the reference policy: a KL loss, or a KL penalty in the reward."""
    return cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


def policy_loss(cfg: Config) -> ActorLoss:
    """The terms of the actor's loss from the loss tables: the policy loss (``actor.policy_loss`` when set, else
    the algorithm's own) and the algorithm's extra losses with their coefficients (those at 0 left out).

    Raises ValueError when a term reads a batch field the algorithm does not give (:func:`check_loss_fields`).
    """
    algorithm = ALGORITHMS[cfg.algorithm.name]
    coefficients = ((name, float(_value(cfg, key))) for name, key in algorithm.extra_losses.items())
    loss = ActorLoss(cfg.actor.policy_loss or algorithm.policy_loss, tuple((n, c) for n, c in coefficients if c))
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
            f"actor.policy_loss={loss.policy} reads {', '.join(missing)}, which algorithm.name={algorithm_name} "
            f"does not compute; use algorithm.name={' or '.join(givers) or '(none computes it)'}, or another "
            "actor.policy_loss")


def key_owners() -> dict[str, list[str]]:
    """Each config key that some algorithms own (:meth:`Algorithm.owned_keys`) -> their names, in table order."""
    owners: dict[str, list[str]] = {}
    for name, cls in ALGORITHMS.items():
        for key in cls.owned_keys():
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


def _value(cfg: Config, dotted: str) -> Any:
    """The config value at a dotted key, e.g. ``actor.positive_lm_coef``."""
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


__all__ = ["ALGORITHMS", "POLICY_LOSSES", "ActorLoss", "Algorithm", "OutcomeAlgorithm", "PolicyLoss",
           "RolloutContext", "build_algorithm", "check_key_ownership", "check_loss_fields", "critic_algorithms",
           "key_owners", "needs_reference", "policy_loss"]
