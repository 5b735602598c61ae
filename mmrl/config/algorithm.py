"""The ``algorithm`` section: the algorithm by name, the keys several share, and each algorithm's own section
(built from the algorithm table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mmrl.algos.table import ALGORITHMS
from mmrl.config_fields import gather_sections, num


@dataclass(kw_only=True)
class AlgorithmKeys:
    """The algorithm by name, the keys several algorithms share, and each algorithm's own keys: the section
    ``algorithm.<name>`` of each algorithm of the table (``mmrl.algos.ALGORITHMS``) that has some. A key of an
    algorithm the run does not use is refused (algorithms.md#the-algorithm-object)."""

    name: str = "grpo"
    """The RL algorithm by name: a name of ``mmrl.algos.ALGORITHMS`` (grpo, ppo, dapo, ...; algorithms.md lists
    them)."""
    norm_adv_by_std: bool = True
    """GRPO: divide by the group's standard deviation (False gives Dr. GRPO's estimator)."""
    epsilon: float = num(1e-6, gt=0)
    """Added to the group's standard deviation before dividing by it."""
    gamma: float = num(1.0, ge=0, le=1)
    """Discount of token-level returns (ppo, vapo, pf_ppo, reinforce_plus_plus)."""
    lam: float = num(1.0, ge=0, le=1)
    """GAE lambda (ppo, pf_ppo)."""
    use_kl_in_reward: bool = False
    """Subtract ``kl_coef`` x a per-token KL(policy || reference) estimate from the token rewards before the
    advantages (REINFORCE++, PPO-style RLHF); needs the reference policy and a separate old-log-prob pass."""
    kl_penalty: Literal["k1", "k2", "k3", "low_var_kl", "abs"] = "k1"
    """The KL estimator of the reward penalty."""
    kl_ctrl: Literal["fixed", "adaptive"] = "fixed"
    """fixed: ``kl_coef`` throughout; adaptive: moved each step towards ``kl_target`` over ``kl_horizon`` samples."""
    kl_coef: float = num(0.001, ge=0)
    """The reward penalty's coefficient (the adaptive controller's start)."""
    kl_target: float = num(0.1, gt=0)
    kl_horizon: int = num(10000, ge=1)
    max_gen_rounds: int = num(4, ge=1)
    """Dynamic sampling (dapo, vapo): generation rounds a step may take to fill its batch with groups whose
    rewards differ; past it the step fails with an error that says what to change."""
    critic_warmup_steps: int = num(0, ge=0)
    """Value pre-training (ppo, vapo, pf_ppo): the first steps train the critic only, the actor waits."""


AlgorithmConfig = gather_sections("AlgorithmConfig", {name: cls.section for name, cls in ALGORITHMS.items()},
                                  AlgorithmKeys, __name__)


