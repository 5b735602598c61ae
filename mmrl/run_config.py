"""The config of a run: loaded, checked against the library's tables, resolved.

:mod:`mmrl.config` sits at the bottom of the library and imports nothing from it; the checks that read the
tables of algorithms, policy losses and rollout engines live here, one layer up, so that loading a config
imports neither torch nor the algorithms. Every stage loads its config with :func:`load_run_config`; a config
built or changed in code becomes a run's config through :func:`prepare_run_config`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mmrl.algos.checks import check_algorithm_config
from mmrl.config import Config, load_config, require_known, resolve
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
