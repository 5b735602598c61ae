"""Keys that were renamed or moved: the old spelling gets an error that names the new one."""

from __future__ import annotations

# Keys that were renamed: the old spelling gets an error that names the new one.
RENAMED = {
    "algorithm.adv_estimator": "algorithm.name (and adv_estimator=gae is now name=ppo)",
    "reward.type": "reward.function (rules), reward.model.path (a reward model) and reward.judge.path (a judge)",
    # The keys of one loss or one algorithm moved into its own section.
    "actor.policy_loss": "actor.loss.policy",
    "actor.clip_ratio_c": "actor.loss.dual_clip.clip_ratio_c",
    "actor.positive_lm_coef": "actor.loss.positive_lm.coef",
    "actor.sppo_eta": "actor.loss.sppo.eta",
    "actor.cispo_clip_low": "actor.loss.cispo.clip_low",
    "actor.cispo_clip_high": "actor.loss.cispo.clip_high",
    "actor.sapo_tau_pos": "actor.loss.sapo.tau_pos",
    "actor.sapo_tau_neg": "actor.loss.sapo.tau_neg",
    "actor.gmpo_clip_low": "actor.loss.gmpo.clip_low",
    "actor.gmpo_clip_high": "actor.loss.gmpo.clip_high",
    "actor.clip_cov_ratio": "actor.loss.clip_cov.ratio",
    "actor.clip_cov_lb": "actor.loss.clip_cov.lb",
    "actor.clip_cov_ub": "actor.loss.clip_cov.ub",
    "actor.kl_cov_ratio": "actor.loss.kl_cov.ratio",
    "actor.kl_cov_coef": "actor.loss.kl_cov.coef",
    "actor.dppo_tv_delta": "actor.loss.dppo_tv.delta",
    "actor.dppo_kl_delta": "actor.loss.dppo_kl.delta",
    "algorithm.pass_k": "algorithm.grpo_pass_k.k",
    "algorithm.filter_mode": "algorithm.pf_ppo.filter_mode",
    "algorithm.filter_k": "algorithm.pf_ppo.filter_k",
    "algorithm.lam_critic": "algorithm.vapo.lam_critic",
    "algorithm.lam_alpha": "algorithm.vapo.lam_alpha",
    # The zoom task's keys moved into its own section.
    "data.zoom_grid": "data.zoom.grid",
    "data.zoom_shapes": "data.zoom.shapes",
    "data.zoom_spot": "data.zoom.spot",
    "data.zoom_call_share": "data.zoom.call_share",
    "data.zoom_direct_share": "data.zoom.direct_share",
    "data.zoom_direct_by_kind": "data.zoom.direct_by_kind",
    "data.zoom_call_cells": "data.zoom.call_cells",
    "data.zoom_cell_names": "data.zoom.cell_names",
}


