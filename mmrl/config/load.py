"""Loading a config: defaults <- a YAML chain <- dotted overrides, each key checked; and back to a dict."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from mmrl.config.renamed import RENAMED
from mmrl.config.root import Config
from mmrl.config_fields import ConfigError

# ---------------------------------------------------------------------------------------------------
# Loading


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults <- YAML file (and its ``base:`` chain) <- ``key.sub=value`` overrides; checked by bounds and
    :meth:`Config.check`, not resolved (:func:`resolve`) and not checked against the library's tables: a run
    loads its config with :func:`mmrl.run_config.load_run_config`, which does both. The keys given are
    recorded in ``given_keys``."""
    raw: dict[str, Any] = _read_yaml_chain(Path(path)) if path else {}
    for item in overrides:
        _apply_override(raw, item)
    cfg = _build(Config, raw, prefix="")
    cfg.given_keys = frozenset(_given_keys(Config, raw, prefix=""))
    cfg.check()
    return cfg


def _given_keys(cls: type, raw: dict[str, Any], prefix: str) -> list[str]:
    """The dotted leaf keys of ``raw`` (already checked against ``cls`` by :func:`_build`)."""
    hints = typing.get_type_hints(cls)
    keys = []
    for name, value in raw.items():
        if dataclasses.is_dataclass(hints[name]) and isinstance(value, dict):
            keys.extend(_given_keys(hints[name], value, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return keys


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
    return key in {"tasks", "sizes", "weights", "verifiers"}


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
    fields = {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("key", True)}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in raw if k not in fields]
    if unknown:
        key = unknown[0]
        if f"{prefix}{key}" in RENAMED:
            raise ConfigError(f"{prefix}{key} was renamed: use {RENAMED[prefix + key]}")
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        raise ConfigError(f"unknown key {prefix}{key}{hint}; allowed keys in {where}: {', '.join(fields)}")
    raw = {name: 0 if value == "auto" and fields[name].metadata.get("auto") else value for name, value in raw.items()}
    kwargs = {name: _coerce(hints[name], value, f"{prefix}{name}") for name, value in raw.items()}
    built = cls(**kwargs)
    _check_bounds(built, prefix)
    return built


def _check_bounds(obj: Any, prefix: str) -> None:
    """Every bounded numeric field of ``obj`` (given or default) lies in its range."""
    for f in dataclasses.fields(obj):
        bounds = f.metadata.get("bounds")
        value = getattr(obj, f.name)
        problem = bounds.violation(value) if bounds is not None else None
        if problem:
            raise ConfigError(f"{prefix}{f.name}={value!r} {problem}")


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
    """The config's keys as plain nested dicts (for YAML dumps and MLflow params); ``given_keys`` is no key."""
    tree = dataclasses.asdict(cfg)
    tree.pop("given_keys", None)
    return tree


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
