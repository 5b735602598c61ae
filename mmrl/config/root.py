"""The whole config (:class:`Config`), its checks that need no table, and :func:`resolve`."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.config.data import DataConfig
from mmrl.config.model import LLM_LINEAR_LAYERS, ModelConfig, TinyModelConfig
from mmrl.config.reward import RewardConfig
from mmrl.config.rollout import RolloutConfig
from mmrl.config.run import BarConfig, EvalConfig, ResourcesConfig, TrackingConfig, TrainerConfig
from mmrl.config.update import ActorConfig, CriticConfig, RMConfig, SFTConfig
from mmrl.config_fields import ConfigError, num


@dataclass(kw_only=True)
class Config:
    seed: int = num(0, ge=0)
    """The one seed: synthetic data (each split derives its own), model init, SFT and RL sampling."""
    model: ModelConfig = field(default_factory=ModelConfig)
    tiny_model: TinyModelConfig = field(default_factory=TinyModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rm: RMConfig = field(default_factory=RMConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    bar: BarConfig = field(default_factory=BarConfig)

    given_keys: frozenset[str] = field(default=frozenset(), repr=False, compare=False, metadata={"key": False})
    """Not a config key: the dotted keys the YAML chain and the overrides set (``"algorithm.pf_ppo.filter_k"``;
    a mapping-valued key such as ``data.tasks`` as a whole), recorded by :func:`load_config`, so that a check
    can tell a key the user set from a default. Empty for a config built in code."""

    def check(self) -> None:
        """The checks that need no table of the library, each naming the keys involved (single values are
        checked by their bounds). It reads and never writes. The checks against the tables of algorithms,
        losses and engines run from the layer above (:mod:`mmrl.run_config`)."""
        if self.reward.function == "none" and not self.reward.weights and not (
            self.reward.model.path or self.reward.judge.path
        ):
            raise ConfigError("reward.function=none leaves nothing to score the samples: set reward.function, "
                              "reward.weights, reward.model.path or reward.judge.path")
        for name in ("actor.vision", "actor.llm", "critic.vision", "critic.llm", "reward.model.vision",
                     "reward.model.llm"):
            _check_part(self, name)
        samples = self.trainer.prompts_per_step * self.rollout.n
        for section in ("actor", "critic"):
            mini = getattr(self, section).num_mini_batches
            if samples < mini * self.resources.num_workers:
                raise ConfigError(
                    f"trainer.prompts_per_step * rollout.n = {samples} samples cannot fill {section}.num_mini_batches="
                    f"{mini} mini-batches on each of resources.num_workers={self.resources.num_workers} workers; "
                    f"lower {section}.num_mini_batches"
                )
        _check_lora(self)
        if self.actor.old_log_probs == "rollout" and (self.rollout.top_p < 1 or self.rollout.top_k > 0):
            raise ConfigError("actor.old_log_probs=rollout needs rollout.top_p=1 and rollout.top_k=0: with a "
                              "truncated distribution the engine's log-probs are not the policy's")
        if self.data.min_pixels > self.data.max_pixels:
            raise ConfigError(f"data.min_pixels={self.data.min_pixels} exceeds data.max_pixels={self.data.max_pixels}")
        if self.data.video_min_frames > self.data.video_max_frames:
            raise ConfigError(f"data.video_min_frames={self.data.video_min_frames} exceeds "
                              f"data.video_max_frames={self.data.video_max_frames}")
        for key, mapping in (("data.tasks", self.data.tasks), ("data.sizes", self.data.sizes)):
            bad = {k: v for k, v in mapping.items() if not (math.isfinite(v) and v >= 0)}
            if bad:
                raise ConfigError(f"{key} values must be finite and >= 0, got {bad}")
        if self.trainer.stop_val_acc and not self.trainer.eval_every:
            raise ConfigError(f"trainer.stop_val_acc={self.trainer.stop_val_acc} stops a run at an evaluation before "
                              "its last step, but trainer.eval_every=0 evaluates only at the last: set "
                              "trainer.eval_every")
        bad_weights = {k: v for k, v in self.reward.weights.items() if not math.isfinite(v)}
        if bad_weights:
            raise ConfigError(f"reward.weights values must be finite numbers, got {bad_weights}")


def require_known(key: str, value: str, table: Mapping[str, Any]) -> None:
    """Raise a ConfigError naming ``key`` and the allowed names when ``value`` is not a name of ``table``."""
    if value not in table:
        raise ConfigError(f"{key}={value!r} is unknown; allowed: {', '.join(sorted(table))}")


def _check_lora(cfg: Config) -> None:
    lora = cfg.actor.lora
    if not lora.rank:
        return
    bad = [name for name in lora.target_modules
           if not name or not all(p.isidentifier() or p.isdigit() for p in name.split("."))]
    if not lora.target_modules or bad:
        raise ConfigError(f"actor.lora.target_modules={lora.target_modules!r} must name linear layers of the language "
                          f"model (e.g. {', '.join(LLM_LINEAR_LAYERS)}){f'; not a layer name: {bad}' if bad else ''}")
    if lora.include_vision and cfg.actor.vision.freeze:
        raise ConfigError("actor.lora.include_vision=true puts trained adapters on the vision tower, but "
                          "actor.vision.freeze=true freezes it: set one of them to false")


def _check_part(cfg: Config, name: str) -> None:
    spec: Any = cfg
    for key in name.split("."):
        spec = getattr(spec, key)
    workers = cfg.resources.num_workers
    if spec.strategy == "hsdp" and (spec.shard_size < 1 or workers % spec.shard_size):
        raise ConfigError(
            f"{name}.strategy=hsdp needs {name}.shard_size dividing resources.num_workers={workers}, "
            f"got {spec.shard_size}"
        )


# ---------------------------------------------------------------------------------------------------
# Derived values


def resolve(cfg: Config) -> Config:
    """A new Config with the derived values filled in; ``cfg`` is left as it is.

    A derived key left at 0 takes its value from the others: ``actor.loss_horizon`` and
    ``critic.loss_horizon`` = ``rollout.max_new_tokens``; ``actor.decay_steps`` and ``critic.decay_steps`` =
    ``trainer.steps x num_mini_batches x ppo_epochs`` of that section. A value already set is kept, so
    resolving a resolved config gives the same config. Change a config before resolving it (better: build it
    with overrides), never after: a resolved config keeps the values derived from the old keys.
    """
    out = copy.deepcopy(cfg)
    for name in ("actor", "critic"):
        section = getattr(out, name)
        setattr(out, name, dataclasses.replace(
            section,
            loss_horizon=section.loss_horizon or out.rollout.max_new_tokens,
            decay_steps=section.decay_steps or out.trainer.steps * section.num_mini_batches * section.ppo_epochs,
        ))
    return out


