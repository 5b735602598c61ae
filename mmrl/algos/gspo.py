"""GSPO (Zheng et al., 2025): GRPO's group advantages with a sequence-level importance ratio, clipped in a
narrow range (policy loss ``gspo``, :func:`mmrl.algos.losses.gspo_loss`; clip ratios of about 3e-4 / 4e-4,
configs/algos/gspo.yaml)."""

from __future__ import annotations

from mmrl.algos.grpo import GRPO


class GSPO(GRPO):
    policy_loss = "gspo"
