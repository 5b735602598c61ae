"""The config of a run: loaded, checked against the library's tables, resolved.

:mod:`mmrl.config` sits near the bottom of the library: it reads only the loss and algorithm tables, whose entries
declare their own sections. The checks that read the tables (an algorithm and its loss, the rollout engines) live
here, one layer up. Every stage loads its config with :func:`load_run_config`; a config built or changed in code
becomes a run's config through :func:`prepare_run_config`; :func:`run_dict` is a run's config as the keys it
reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmrl.algos.checks import check_algorithm_config
from mmrl.algos.losses import LOSSES
from mmrl.algos.table import ALGORITHMS
from mmrl.config import Config, load_config, require_known, resolve, to_dict
from mmrl.rollout import ENGINES


def load_run_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults <- YAML chain <- overrides (:func:`mmrl.config.load_config`), checked against the tables,
    with its derived values resolved (:func:`mmrl.config.resolve`). Raises ConfigError naming the key."""
    return prepare_run_config(load_config(path, overrides))


def prepare_run_config(cfg: Config) -> Config:
    """``cfg`` checked (:meth:`Config.check` and :func:`check_run_config`) and resolved into a new Config;
    ``cfg`` itself is left as it is. On a resolved config it returns an equal one."""
    cfg.check()
    check_run_config(cfg)
    return resolve(cfg)


def check_run_config(cfg: Config) -> None:
    """The cross-table checks: the algorithm and its loss (:mod:`mmrl.algos.checks`), the rollout engines."""
    check_algorithm_config(cfg, cfg.given_keys)
    require_known("rollout.engine", cfg.rollout.engine, ENGINES)
    if cfg.reward.judge.engine:
        require_known("reward.judge.engine", cfg.reward.judge.engine, ENGINES)


CONVERTER_KEYS = ("jsonl", "format", "image_dir", "split")
"""The ``data`` keys only the converter of a user's file reads (``make data`` with ``data.jsonl`` set)."""


LATER_KEYS: dict[tuple[str, str], Any] = {
    ("tracking", "trace_episodes"): 0,
    ("tracking", "mfu"): True,
    ("trainer", "profile_steps"): [],
    ("trainer", "stop_val_acc"): 0.0,
    ("model", "compile"): True,  # fused kernels: the same math as eager, to float rounding
}
"""Keys added after runs were recorded, each with the value at which a run is the run as it was before the key
existed: there, :func:`run_dict` leaves it out, so the records' config hashes stay current."""


def run_dict(cfg: Config) -> dict[str, Any]:
    """``cfg`` as nested dicts without the keys it does not read: of ``actor.loss``, only the sections of its
    policy loss and of its algorithm's extra losses; of ``algorithm``, only its algorithm's own; without a user's
    file (``data.jsonl``), none of the converter's :data:`CONVERTER_KEYS`; none of the :data:`LATER_KEYS` at their
    old behaviour; without in-flight updates, no ``rollout.partial*``. Two runs read the same keys with the same
    values when their dicts are equal, whatever losses and algorithms the tables hold."""
    tree = to_dict(cfg)
    if not cfg.data.jsonl:
        tree["data"] = {key: value for key, value in tree["data"].items() if key not in CONVERTER_KEYS}
    algorithm = ALGORITHMS[cfg.algorithm.name]
    losses = {cfg.actor.loss.policy or algorithm.policy_loss, *algorithm.extra_losses}
    tree["actor"]["loss"] = {key: value for key, value in tree["actor"]["loss"].items()
                             if key not in LOSSES or key in losses}
    tree["algorithm"] = {key: value for key, value in tree["algorithm"].items()
                         if key not in ALGORITHMS or key == cfg.algorithm.name}
    for (section, key), old in LATER_KEYS.items():
        if tree[section][key] == old:
            del tree[section][key]
    if not cfg.rollout.partial:  # whole batches on one version: the run as it was before in-flight updates
        for key in ("partial", "partial_poll_tokens"):
            del tree["rollout"][key]
    return tree
