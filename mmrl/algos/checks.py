"""The config checks that read the algorithm and loss tables (run by :func:`mmrl.run_config.check_run_config`).

Each rule names the keys involved and the fix. ``given`` is the set of dotted keys the user set
(:attr:`mmrl.config.Config.given_keys`), for rules that must tell a key the user set from a default.
"""

from __future__ import annotations

from collections.abc import Iterable

from mmrl.algos import ALGORITHMS, check_key_ownership, critic_algorithms, policy_loss
from mmrl.algos.base import Algorithm
from mmrl.algos.losses import LOSSES, policy_losses
from mmrl.config import Config, ConfigError, require_known


def check_algorithm_config(cfg: Config, given: frozenset[str]) -> None:
    """Raise a ConfigError when ``cfg`` asks what its algorithm cannot do."""
    require_known("algorithm.name", cfg.algorithm.name, ALGORITHMS)
    algorithm = ALGORITHMS[cfg.algorithm.name]
    loss = cfg.actor.loss.policy or algorithm.policy_loss
    require_known("actor.loss.policy", loss, policy_losses())
    spec = LOSSES[loss]
    if cfg.rollout.n < algorithm.min_group_size:
        raise ConfigError(f"rollout.n={cfg.rollout.n}: {cfg.algorithm.name} compares the responses of one "
                          f"prompt, so it needs rollout.n >= {algorithm.min_group_size}")
    algorithm.check(cfg)
    if spec.sequence_agg and cfg.actor.loss_agg_mode == "token-mean":
        raise ConfigError(f"the {loss} policy loss is one term per sequence: set actor.loss_agg_mode to a "
                          "sequence mode (seq-mean-token-mean), not token-mean")
    if cfg.algorithm.critic_warmup_steps and not algorithm.needs_critic:
        raise ConfigError(f"algorithm.critic_warmup_steps={cfg.algorithm.critic_warmup_steps}: "
                          f"{cfg.algorithm.name} trains no critic; use {', '.join(critic_algorithms())}, or set it to 0")
    check_loss_sections(loss, given)
    if cfg.actor.rollout_correction != "none" and not spec.linear:
        linear = sorted(name for name, other in policy_losses().items() if other.linear)
        raise ConfigError(f"actor.rollout_correction={cfg.actor.rollout_correction} weights each token's "
                          f"policy-gradient term through its advantage, which the {loss} loss does not scale with; "
                          f"use it with {', '.join(linear)}, or actor.rollout_correction=none")
    if cfg.trainer.guide_unsolved:
        check_guidance(cfg)
    if cfg.trainer.mode == "async":
        check_async(cfg, algorithm)
    if cfg.rollout.partial:
        check_partial(cfg)
    if cfg.rollout.weight_transport == "nccl":
        raise NotImplementedError("rollout.weight_transport=nccl: the NCCL/CUDA-IPC broadcast to the rollout pool is a "
                                  "seam, not built (mmrl/trainer/weight_transport.py); use object_store")
    try:
        check_key_ownership(cfg.algorithm.name, given)
        policy_loss(cfg)  # every loss term's batch fields are ones the algorithm computes
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_loss_sections(loss: str, given: Iterable[str]) -> None:
    """Raise a ConfigError when a key of ``given`` lies in the section of another policy loss than ``loss``
    (``actor.loss.<other>.<key>``): the run would ignore it. The extra losses' sections belong to the algorithms
    that add them (:func:`mmrl.algos.check_key_ownership`)."""
    owners = {key: name for name, spec in policy_losses().items() if name != loss for key in spec.section_keys()}
    foreign = sorted(key for key in set(given) if key in owners)
    if foreign:
        each = ", ".join(f"{key} (the {owners[key]} loss's)" for key in foreign)
        raise ConfigError(f"{each}: actor.loss.policy={loss} does not read it; remove it or choose that loss")


def check_guidance(cfg: Config) -> None:
    """What ``trainer.guide_unsolved`` needs: the trainer's own old log-probs, and for agent episodes the ranks that
    ran them (sync mode)."""
    if cfg.rollout.agent.enabled and cfg.trainer.mode == "async":
        raise ConfigError("trainer.guide_unsolved with rollout.agent in trainer.mode=async: a guide episode runs its "
                          "tools on the rank that holds the prompt, and in async mode that is a rollout-pool rank the "
                          "step no longer calls; use trainer.mode=sync or trainer.guide_unsolved=false")
    if cfg.actor.old_log_probs == "rollout":
        raise ConfigError("trainer.guide_unsolved with actor.old_log_probs=rollout: a guide has no engine log-probs, "
                          "so its old log-probs must be the trainer's; set actor.old_log_probs=auto or recompute")


def check_async(cfg: Config, algorithm: type[Algorithm]) -> None:
    """What ``trainer.mode=async`` cannot do yet, each refused with its reason."""
    name = cfg.algorithm.name
    if algorithm.collect is not Algorithm.collect:
        raise ConfigError(f"trainer.mode=async generates each step's prompts ahead of the step, one round each; "
                          f"{name} collects its own way (DAPO's and VAPO's dynamic sampling draw more prompts "
                          "until their batch is full), which the async buffer does not serve yet: use "
                          "trainer.mode=sync")
    if algorithm.extra_rollouts is not Algorithm.extra_rollouts:
        raise ConfigError(f"trainer.mode=async: {name} generates extra rollouts with the current weights inside the "
                          "step (ReMax's greedy baseline), which the rollout pool would give from older weights: "
                          "use trainer.mode=sync")


def check_partial(cfg: Config) -> None:
    """What ``rollout.partial`` (in-flight weight updates) needs: a rollout pool that weights reach while it
    generates (async mode), and an engine whose decode loop can switch weights between tokens (hf)."""
    if cfg.trainer.mode != "async":
        raise ConfigError("rollout.partial=true loads new weights into generations already running on the rollout "
                          "pool; in trainer.mode=sync the weights never change during a generation: set "
                          "trainer.mode=async, or rollout.partial=false")
    if cfg.rollout.engine != "hf":
        raise ConfigError(f"rollout.partial=true with rollout.engine={cfg.rollout.engine}: only the hf engine's "
                          "decode loop switches weights between tokens (vLLM would need its engine paused and its KV "
                          "cache dropped at a token boundary, not built); use rollout.engine=hf or rollout.partial=false")
