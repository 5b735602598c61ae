"""Typed, keyword-only config dataclasses: embedded defaults, YAML files, dotted overrides.

A config is built in three layers: the defaults below, a YAML file (which may name a ``base:`` YAML
it extends), then ``section.key=value`` overrides from the command line. Every key is checked before
anything starts: an unknown key or a value of the wrong type fails with a :class:`ConfigError` that
names the key and what is allowed.

    cfg = load_config("configs/grpo_image.yaml", ["rollout.n=8", "actor.lr=1e-4"])
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from mmrl.models.tiny import TinyVLMSpec


class ConfigError(ValueError):
    """A config key or value that cannot be used; the message names the key and the fix."""


@dataclass(kw_only=True)
class ModelConfig:
    path: str = "outputs/model/tiny-qwen2.5-vl"
    """Local directory of a Hugging Face VLM checkpoint (the tiny model, or e.g. Qwen2.5-VL-3B-Instruct)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for training and rollout."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    """Attention kernel passed to transformers."""


Strategy = Literal["replicate", "fsdp", "hsdp"]


@dataclass(kw_only=True)
class PartConfig:
    """How one part of a model (the vision encoder or the LLM) is laid out over a worker group."""

    strategy: Strategy = "replicate"
    """replicate: full copy per rank, gradients all-reduced; fsdp: FSDP2 over all ranks; hsdp: FSDP2 within
    groups of ``shard_size`` ranks, replicated across the groups."""
    shard_size: int = 0
    """hsdp only: ranks per shard group (must divide resources.num_workers)."""


@dataclass(kw_only=True)
class VisionPartConfig(PartConfig):
    freeze: bool = False
    """Keep the vision encoder's weights fixed (no gradients, no optimizer state)."""


@dataclass(kw_only=True)
class DataConfig:
    dir: str = "outputs/data"
    """Folder of the prompt parquet files, one per split (``<dir>/<split>.parquet``)."""
    tasks: dict[str, float] = field(default_factory=lambda: {"colour": 1.0})
    """Synthetic task mix: task name -> fraction (colour, count, shape)."""
    sizes: dict[str, int] = field(default_factory=lambda: {"sft": 48, "train": 2048, "val": 128, "test": 400})
    """Rows per split for the synthetic generator."""
    image_size: int = 112
    """Side of the synthetic square images, in pixels."""
    max_count: int = 3
    """Largest number of shapes in the count task."""
    min_pixels: int = 28 * 28
    """Pixel budget, lower bound, applied to a user's images."""
    max_pixels: int = 448 * 448
    """Pixel budget, upper bound, applied to a user's images."""
    jsonl: str = ""
    """A user's JSONL of {prompt, image|images, answer}: when set, ``make data`` converts it instead."""
    image_dir: str = ""
    """Folder that the JSONL's image paths are relative to."""
    split: str = "train"
    """Name of the split written by the converter."""


@dataclass(kw_only=True)
class SFTConfig:
    init: str = ""
    """Checkpoint to start from; empty means ``model.path``."""
    split: str = "sft"
    """The labelled split to train on."""
    out_dir: str = "outputs/sft"
    """Where the checkpoint (``<out_dir>/checkpoint``) is written."""
    steps: int = 60
    batch_size: int = 16
    lr: float = 2e-3
    weight_decay: float = 0.0
    warmup_steps: int = 5
    grad_clip: float = 1.0


@dataclass(kw_only=True)
class RolloutConfig:
    engine: Literal["hf", "vllm"] = "hf"
    """Generation engine: ``hf`` (transformers generate) or ``vllm``."""
    n: int = 8
    """Responses sampled per prompt."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int = 16
    """Response length limit, in tokens."""
    micro_batch_size: int = 64
    """Sequences per generate call."""


@dataclass(kw_only=True)
class UpdateConfig:
    """What the actor and the critic share: the optimizer, the mini-batch loop and the layout."""

    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 10
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    """Passes over each step's batch."""
    num_mini_batches: int = 2
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward (gradient accumulation inside a mini-batch)."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    vision: VisionPartConfig = field(default_factory=VisionPartConfig)
    """Layout of the vision encoder (for the actor: of the reference too, which follows the actor)."""
    llm: PartConfig = field(default_factory=PartConfig)
    """Layout of the language model (embeddings, decoder layers, head)."""


@dataclass(kw_only=True)
class ActorConfig(UpdateConfig):
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    """PPO clip range [1 - low, 1 + high]; DAPO's clip-higher raises ``high``."""
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    """Add a KL(policy || reference) penalty to the loss (needs the reference policy)."""
    kl_loss_coef: float = 0.001
    kl_estimator: Literal["k1", "k2", "k3", "low_var_kl"] = "k3"


@dataclass(kw_only=True)
class CriticConfig(UpdateConfig):
    """The value model of PPO: the policy's VLM backbone with a scalar head per token."""

    lr: float = 1e-3
    init: str = ""
    """Checkpoint the backbone starts from; empty = trainer.init (the SFT policy)."""
    cliprange_value: float = 0.5
    """Clip range of the value update around the rollout-time values (PPO's clipped value loss)."""
    placement: Literal["colocate", "separate"] = "colocate"
    """colocate: the critic's ranks share the actor's resource pool (bundles); separate: its own pool."""


@dataclass(kw_only=True)
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """Advantage estimator by name (see ``mmrl.algos.advantages.ESTIMATORS``)."""
    norm_adv_by_std: bool = True
    """GRPO: divide by the group's standard deviation (False gives Dr. GRPO)."""
    epsilon: float = 1e-6
    gamma: float = 1.0
    """GAE discount (adv_estimator=gae)."""
    lam: float = 1.0
    """GAE lambda (adv_estimator=gae)."""


@dataclass(kw_only=True)
class RewardConfig:
    function: str = "answer_match"
    """A registered reward name, or ``path/to/file.py:function``."""
    weights: dict[str, float] = field(default_factory=dict)
    """When set, the reward is the weighted sum of these registered rewards (``function`` is then ignored)."""
    timeout_s: float = 10.0
    """A reward call that takes longer scores 0 and is counted."""


@dataclass(kw_only=True)
class TrainerConfig:
    init: str = "outputs/sft/checkpoint"
    """Checkpoint the RL run starts from."""
    out_dir: str = "outputs/rl"
    """Where the final checkpoint (``<out_dir>/checkpoint``) is written."""
    steps: int = 100
    prompts_per_step: int = 16
    eval_every: int = 25
    """Evaluate on the val split every this many steps (0: only at the end)."""
    val_size: int = 128
    """Val prompts per evaluation."""
    experiment: str = "mmrl"
    """MLflow experiment name."""
    run_name: str = ""


@dataclass(kw_only=True)
class EvalConfig:
    checkpoint: str = "outputs/rl/checkpoint"
    split: str = "test"
    batch_size: int = 64
    max_new_tokens: int = 16
    run_name: str = ""


@dataclass(kw_only=True)
class ResourcesConfig:
    num_workers: int = 1
    """Workers in the actor/rollout/reference group (data-parallel ranks)."""
    threads_per_worker: int = 0
    """torch threads per worker; 0 means the machine's cores divided by the number of workers."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto`` takes a GPU when one is visible."""
    ray_address: str = ""
    """An existing Ray cluster's address; empty starts a local Ray."""


@dataclass(kw_only=True)
class TrackingConfig:
    uri: str = ""
    """MLflow tracking URI; empty means $MLFLOW_TRACKING_URI, else a sqlite file under outputs/."""
    sqlite_path: str = "outputs/mlflow.db"
    """The default store's sqlite file."""
    artifact_dir: str = "outputs/mlartifacts"
    """Where the default store keeps run artifacts (curves, rollout tables)."""


@dataclass(kw_only=True)
class Config:
    seed: int = 0
    """The one seed: synthetic data (each split derives its own), model init, SFT and RL sampling."""
    model: ModelConfig = field(default_factory=ModelConfig)
    tiny_model: TinyVLMSpec = field(default_factory=TinyVLMSpec)
    data: DataConfig = field(default_factory=DataConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    @property
    def uses_critic(self) -> bool:
        """PPO with GAE needs a value model; the outcome estimators (GRPO, RLOO) do not."""
        return self.algorithm.adv_estimator == "gae"

    def validate(self) -> None:
        """Cross-field checks, each naming the keys involved."""
        _positive(self, ["rollout.n", "rollout.max_new_tokens", "trainer.steps", "trainer.prompts_per_step",
                         "actor.ppo_epochs", "actor.num_mini_batches", "actor.micro_batch_size",
                         "resources.num_workers", "sft.batch_size", "eval.batch_size"])
        from mmrl.algos.advantages import ESTIMATORS

        allowed = sorted([*ESTIMATORS, "gae"])
        if self.algorithm.adv_estimator not in allowed:
            raise ConfigError(
                f"algorithm.adv_estimator={self.algorithm.adv_estimator!r} is unknown; allowed: {', '.join(allowed)}"
            )
        for name in ("actor.vision", "actor.llm", "critic.vision", "critic.llm"):
            _check_part(self, name)
        if self.algorithm.adv_estimator in ("grpo", "rloo") and self.rollout.n < 2:
            raise ConfigError(f"rollout.n={self.rollout.n}: {self.algorithm.adv_estimator} compares the "
                              "responses of one prompt, so it needs rollout.n >= 2")
        if not 0 < self.rollout.top_p <= 1:
            raise ConfigError(f"rollout.top_p={self.rollout.top_p} must be in (0, 1]")
        if self.rollout.temperature <= 0:
            raise ConfigError(f"rollout.temperature={self.rollout.temperature} must be > 0 (greedy is for eval)")
        samples = self.trainer.prompts_per_step * self.rollout.n
        if samples < self.actor.num_mini_batches * self.resources.num_workers:
            raise ConfigError(
                f"trainer.prompts_per_step * rollout.n = {samples} samples cannot fill actor.num_mini_batches="
                f"{self.actor.num_mini_batches} mini-batches on each of resources.num_workers="
                f"{self.resources.num_workers} workers; lower actor.num_mini_batches"
            )
        if self.rollout.engine == "vllm":
            raise ConfigError("rollout.engine=vllm is not implemented yet; use rollout.engine=hf")


def _check_part(cfg: Config, name: str) -> None:
    section, part = name.split(".")
    spec: PartConfig = getattr(getattr(cfg, section), part)
    workers = cfg.resources.num_workers
    if spec.strategy == "hsdp" and (spec.shard_size < 1 or workers % spec.shard_size):
        raise ConfigError(
            f"{name}.strategy=hsdp needs {name}.shard_size dividing resources.num_workers={workers}, "
            f"got {spec.shard_size}"
        )


def _positive(cfg: Config, keys: list[str]) -> None:
    for key in keys:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value <= 0:
            raise ConfigError(f"{key}={value} must be a positive number")


# ---------------------------------------------------------------------------------------------------
# Loading


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults <- YAML file (and its ``base:`` chain) <- ``key.sub=value`` overrides; validated."""
    raw: dict[str, Any] = _read_yaml_chain(Path(path)) if path else {}
    for item in overrides:
        _apply_override(raw, item)
    cfg = _build(Config, raw, prefix="")
    cfg.validate()
    return cfg


def _read_yaml_chain(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass a YAML under configs/")
    if path.resolve() in seen:
        raise ConfigError(f"config file {path} names itself as a base (cycle: {[str(p) for p in seen]})")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    merged = _read_yaml_chain(path.parent / base, seen + (path.resolve(),))
    _deep_merge(merged, data)
    return merged


def _deep_merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and not _is_leaf_mapping(key):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def _is_leaf_mapping(key: str) -> bool:
    # Mapping-valued fields (task mixes, reward weights) are replaced whole, not merged key by key.
    return key in {"tasks", "sizes", "weights"}


def _apply_override(raw: dict[str, Any], item: str) -> None:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value (e.g. rollout.n=8)")
    dotted, text = item.split("=", 1)
    keys = dotted.strip().split(".")
    node = raw
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {key!r} is not a section")
    node[keys[-1]] = yaml.safe_load(text) if text.strip() else ""


def _build(cls: type, raw: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping of keys, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in raw if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        raise ConfigError(f"unknown key {prefix}{key}{hint}; allowed keys in {where}: {', '.join(fields)}")
    kwargs = {name: _coerce(hints[name], value, f"{prefix}{name}") for name, value in raw.items()}
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}={value!r} is not allowed; allowed values: {', '.join(map(str, args))}")
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in args:
            if option is type(None) and value is None:
                return None
            try:
                return _coerce(option, value, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(f"{key}={value!r} matches none of its types: {'; '.join(errors)}")
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        key_t, val_t = args
        return {_coerce(key_t, k, f"{key}.{k}"): _coerce(val_t, v, f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    return _coerce_scalar(tp, value, key)


def _coerce_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    elif tp is Any:
        return value
    raise ConfigError(f"{key}={value!r} must be of type {getattr(tp, '__name__', tp)}")


def to_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as plain nested dicts (for YAML dumps and MLflow params)."""
    return dataclasses.asdict(cfg)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
