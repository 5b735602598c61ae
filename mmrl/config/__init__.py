"""Typed, keyword-only config dataclasses: embedded defaults, YAML files, dotted overrides.

A config is built in three layers: the defaults, a YAML file (which may name a ``base:`` YAML it extends), then
``section.key=value`` overrides from the command line. Every key is checked before anything starts: an unknown
key or a value of the wrong type fails with a :class:`ConfigError` that names the key and what is allowed.

Each section lives in the module of its owner:

=============  ===============================================================================================
module         sections
=============  ===============================================================================================
``model``      ``model``, ``tiny_model``, the per-part layouts (``<group>.vision``, ``<group>.llm``), ``actor.lora``
``data``       ``data``, with each synthetic task's own section (``data.zoom``)
``rollout``    ``rollout``, ``rollout.agent``
``update``     ``sft``, ``rm``, ``actor`` (its ``actor.loss`` built from the loss table), ``critic``
``algorithm``  ``algorithm`` (each algorithm's own section built from the algorithm table)
``reward``     ``reward``, ``reward.model``, ``reward.judge``
``run``        ``trainer``, ``eval``, ``resources``, ``tracking``, ``bar``
``root``       :class:`Config`, :meth:`Config.check` (the checks that need no table) and :func:`resolve`
``load``       :func:`load_config` (YAML chain and overrides), :func:`to_dict`, :func:`flatten`
``renamed``    the keys that moved, each old spelling refused with the new one
=============  ===============================================================================================

Of the library the package imports only the field helpers (:mod:`mmrl.config_fields`) and the two tables whose
entries declare their own sections: the losses (``actor.loss.<name>``, :data:`mmrl.algos.losses.LOSSES`) and the
algorithms (``algorithm.<name>``, :data:`mmrl.algos.table.ALGORITHMS`). The checks against the tables of
algorithms, losses and engines run one layer up, in :mod:`mmrl.run_config`, whose ``load_run_config`` is what a
run loads its config with::

    cfg = load_run_config("configs/grpo_image.yaml", ["rollout.n=8", "actor.lr=1e-4"])
"""

from __future__ import annotations

from mmrl.config.algorithm import AlgorithmConfig, AlgorithmKeys
from mmrl.config.data import DataConfig, ZoomTaskConfig
from mmrl.config.load import _read_yaml_chain, flatten, load_config, to_dict
from mmrl.config.model import (LLM_LINEAR_LAYERS, LoRAConfig, ModelConfig, PartConfig, TinyModelConfig,
                               VisionPartConfig)
from mmrl.config.renamed import RENAMED
from mmrl.config.reward import JudgeConfig, RewardConfig, RewardModelConfig
from mmrl.config.rollout import AgentConfig, RolloutConfig
from mmrl.config.root import Config, require_known, resolve
from mmrl.config.run import BarConfig, EvalConfig, ResourcesConfig, TrackingConfig, TrainerConfig
from mmrl.config.update import (ActorConfig, CriticConfig, LossConfig, LossKeys, OptimConfig, RMConfig, SFTConfig,
                                UpdateConfig)
from mmrl.config_fields import ConfigError, auto_size, num

__all__ = ["LLM_LINEAR_LAYERS", "RENAMED", "ActorConfig", "AgentConfig", "AlgorithmConfig", "AlgorithmKeys", "BarConfig",
           "Config", "ConfigError", "CriticConfig", "DataConfig", "EvalConfig", "JudgeConfig", "LoRAConfig",
           "LossConfig", "LossKeys", "ModelConfig", "OptimConfig", "PartConfig", "RMConfig", "ResourcesConfig",
           "RewardConfig", "RewardModelConfig", "RolloutConfig", "SFTConfig", "TinyModelConfig", "TrackingConfig",
           "TrainerConfig", "UpdateConfig", "VisionPartConfig", "ZoomTaskConfig", "_read_yaml_chain", "auto_size",
           "flatten", "load_config", "num", "require_known", "resolve", "to_dict"]
