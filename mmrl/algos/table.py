"""The table of algorithms: ``algorithm.name`` -> its :class:`~mmrl.algos.base.Algorithm` class (one module each).

:mod:`mmrl.config` gathers each algorithm's own section (``algorithm.<name>``, its class's ``section``) from this
table, so it imports no module that imports the config; :mod:`mmrl.algos` re-exports it with the helpers that
read it. To add an algorithm, write its module and add one line here (docs/algorithms.md#adding-an-algorithm).
"""

from __future__ import annotations

from mmrl.algos.base import Algorithm
from mmrl.algos.dapo import DAPO
from mmrl.algos.dr_grpo import DrGRPO
from mmrl.algos.grpo import GRPO
from mmrl.algos.gspo import GSPO
from mmrl.algos.opo import OPO
from mmrl.algos.otb import OTB
from mmrl.algos.pass_at_k import PassAtK
from mmrl.algos.pf_ppo import PFPPO
from mmrl.algos.ppo import PPO
from mmrl.algos.reinforce_pp import ReinforcePP, ReinforcePPBaseline
from mmrl.algos.remax import ReMax
from mmrl.algos.rloo import RLOO
from mmrl.algos.sppo import SPPO
from mmrl.algos.vapo import VAPO

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
    "otb": OTB,
}
