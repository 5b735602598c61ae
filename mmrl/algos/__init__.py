"""RL algorithms as objects, and the policy losses they name.

``ALGORITHMS`` maps ``algorithm.name`` to an :class:`~mmrl.algos.base.Algorithm` subclass; the driver
and the config validation read only its declarations (critic, reference, group size, reward level, loss).
To add an algorithm, write one module here with a subclass and add one entry to the table, e.g.::

    # mmrl/algos/maxmin.py
    class MaxMin(OutcomeAlgorithm):
        min_group_size = 2

        def outcome_advantages(self, scores, uids):
            _, mean, _ = group_stats(scores, uids)
            return scores - mean

    # here
    ALGORITHMS = {..., "maxmin": MaxMin}

A new policy loss is one function in :mod:`mmrl.algos.losses` plus one entry in ``POLICY_LOSSES``.
"""

from __future__ import annotations

from mmrl.algos.base import Algorithm, OutcomeAlgorithm
from mmrl.algos.dapo import DAPO
from mmrl.algos.dr_grpo import DrGRPO
from mmrl.algos.grpo import GRPO
from mmrl.algos.gspo import GSPO
from mmrl.algos.losses import POLICY_LOSSES, PolicyLoss
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
}


def build_algorithm(cfg: Config) -> Algorithm:
    """The algorithm ``algorithm.name`` names (validated at config load)."""
    return ALGORITHMS[cfg.algorithm.name](cfg.algorithm)


def needs_reference(cfg: Config) -> bool:
    """Whether the run needs the reference policy: a KL loss or KL penalty in the reward, or an algorithm that
    declares it."""
    return cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward or ALGORITHMS[cfg.algorithm.name].needs_reference


def policy_loss(cfg: Config) -> PolicyLoss:
    """The policy loss: ``actor.policy_loss`` when set, else the algorithm's own."""
    return POLICY_LOSSES[cfg.actor.policy_loss or ALGORITHMS[cfg.algorithm.name].policy_loss]


__all__ = ["ALGORITHMS", "POLICY_LOSSES", "Algorithm", "OutcomeAlgorithm", "PolicyLoss", "build_algorithm",
           "needs_reference", "policy_loss"]
