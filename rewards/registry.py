"""Turning a reward spec from a config into a reward function.

A spec is plain data (so that a worker process can resolve it itself), one of:

* a registered name, e.g. ``"answer_match"`` (see :func:`available`), or the name of an installed
  plugin (entry-point group ``mmrl.rewards``);
* ``"path/to/file.py:function"``, a function in a Python file (a relative path is taken from the
  working directory);
* ``{"weighted": {"answer_match": 0.9, "format": 0.1}}``, a weighted sum of specs (one function);
* ``{"by_data_source": {"geo/count": "count_match", "ocr": "my/ocr.py:score"}, "default": "answer_match"}``:
  each sample is scored by the spec its ``data_source`` names, any other source by ``default``
  (required).

Installed packages add names through the ``mmrl.rewards`` entry-point group,
e.g. in their pyproject.toml::

    [project.entry-points."mmrl.rewards"]
    my_reward = "my_package.rewards:score"

A name registered with :func:`register` by the driver's own code exists in that process only: worker
processes know the names registered on ``import rewards`` and the installed plugins.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import numbers
import os
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from rewards.types import RewardFn, describe_fn
from rewards.compose import by_data_source, weighted
from rewards.verifiers import BUILTINS

ENTRY_POINT_GROUP = "mmrl.rewards"
_SPEC_FORMS = ("a registered name, 'path/to/file.py:function', {'weighted': {spec: weight, ...}} or "
               "{'by_data_source': {data_source: spec, ...}, 'default': spec}")
Spec = str | Mapping  # see the module docstring

F = TypeVar("F", bound=Callable)

_REGISTRY: dict[str, RewardFn] = {}


def register(name: str) -> Callable[[F], F]:
    """Decorator registering a reward function under ``name``."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"reward name {name!r} is invalid; use a non-empty string without ':'")

    def decorator(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"register({name!r}) was applied to {fn!r}, which is not callable")
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(
                f"reward name {name!r} is already registered to {describe_fn(existing)}; "
                "register yours under a different name"
            )
        _REGISTRY[name] = fn
        return fn

    return decorator


for _name, _fn in BUILTINS.items():
    register(_name)(_fn)


def available() -> list[str]:
    """All names :func:`resolve` accepts: registered ones and installed plugins."""
    return sorted(set(_REGISTRY) | set(_plugin_entry_points()))


def resolve(spec: Spec | RewardFn) -> RewardFn:
    """The reward function a spec names (a callable is returned as is)."""
    if isinstance(spec, Mapping):
        return _resolve_mapping(spec)
    if isinstance(spec, str):
        if is_file_spec(spec):
            return load_from_file(spec)
        return _resolve_name(spec)
    if callable(spec):
        return spec
    raise TypeError(f"reward spec must be {_SPEC_FORMS}; got a {type(spec).__name__}: {spec!r}")


def is_file_spec(spec: str) -> bool:
    """Whether ``spec`` names a Python file (``path/to/file.py:function``) rather than a registered name."""
    return spec.endswith(".py") or (":" in spec and spec.rsplit(":", 1)[0].endswith(".py"))


def _resolve_mapping(spec: Mapping) -> RewardFn:
    form = _mapping_form(spec)
    if form == "weighted":
        return weighted(spec["weighted"])
    return by_data_source(spec["by_data_source"], spec["default"])


def _mapping_form(spec: Mapping) -> str:
    if set(spec) == {"weighted"}:
        return "weighted"
    if set(spec) == {"by_data_source", "default"}:
        return "by_data_source"
    raise ValueError(
        "a dict reward spec must be {'weighted': {spec: weight, ...}} or "
        f"{{'by_data_source': {{data_source: spec, ...}}, 'default': spec}}; "
        f"got keys {sorted(map(str, spec))}"
    )


def check_spec(spec: object) -> None:
    """Check a spec without running any plugin code: its form, that its names are known and its files exist.

    Raises TypeError or ValueError as :func:`resolve` would for the mistakes it can see; whether a
    file defines the function is only known once a worker imports it.
    """
    if isinstance(spec, Mapping):
        if _mapping_form(spec) == "weighted":
            _check_weights(spec["weighted"])
        else:
            _check_table(spec["by_data_source"])
            check_spec(spec["default"])
    elif isinstance(spec, str):
        if is_file_spec(spec):
            _split_file_spec(spec)
        elif spec not in _REGISTRY and spec not in _plugin_entry_points():
            raise ValueError(f"unknown reward {spec!r}; valid names: {available()}; or give {_SPEC_FORMS}")
    else:
        raise TypeError(f"reward spec must be {_SPEC_FORMS}; got a {type(spec).__name__}: {spec!r}")


def _check_weights(weights: object) -> None:
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(f"'weighted' needs a non-empty dict of reward spec -> weight, got {weights!r}")
    for name, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
            raise TypeError(f"the weight of reward {name!r} must be a finite number, got {weight!r}")
        check_spec(name)


def _check_table(table: object) -> None:
    if not isinstance(table, Mapping):
        raise TypeError(f"'by_data_source' must map a data_source to a reward spec, got {table!r}")
    for source, spec in table.items():
        if not isinstance(source, str):
            raise TypeError(f"'by_data_source': data_source {source!r} is not a string")
        check_spec(spec)


def absolute_spec(spec: Spec) -> Spec:
    """A checked ``spec`` with every file path made absolute, for a process in another directory."""
    if isinstance(spec, str):
        if not is_file_spec(spec):
            return spec
        path, _, function = spec.rpartition(":")
        return f"{Path(path).expanduser().absolute()}:{function}"
    if _mapping_form(spec) == "weighted":
        return {"weighted": {absolute_spec(name): weight for name, weight in spec["weighted"].items()}}
    table = {source: absolute_spec(inner) for source, inner in spec["by_data_source"].items()}
    return {"by_data_source": table, "default": absolute_spec(spec["default"])}


def snapshot_import_time_names() -> None:
    """Record the names known once ``rewards`` is imported: those a fresh worker process knows too."""
    global _IMPORT_TIME_NAMES
    _IMPORT_TIME_NAMES = frozenset(_REGISTRY)


def registered_here_only(name: str) -> bool:
    """Whether ``name`` was registered by this process's own code after import (unknown to a worker)."""
    return name in _REGISTRY and name not in _IMPORT_TIME_NAMES and name not in _plugin_entry_points()


_IMPORT_TIME_NAMES: frozenset[str] = frozenset()


def _resolve_name(name: str) -> RewardFn:
    if name in _REGISTRY:
        return _REGISTRY[name]
    entry_point = _plugin_entry_points().get(name)
    if entry_point is None:
        raise ValueError(f"unknown reward {name!r}; valid names: {available()}; or give {_SPEC_FORMS}")
    return register(name)(_load_entry_point(entry_point))


def _plugin_entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load_entry_point(entry_point: metadata.EntryPoint) -> RewardFn:
    try:
        fn = entry_point.load()
    except (ImportError, AttributeError) as exc:
        raise ValueError(
            f"reward plugin {entry_point.name!r} (entry point {entry_point.value!r} in group "
            f"{ENTRY_POINT_GROUP!r}) failed to load: {exc}; fix or uninstall the package that provides it"
        ) from exc
    if not callable(fn):
        raise ValueError(
            f"reward plugin {entry_point.name!r} points at {entry_point.value!r}, which is not callable; "
            "point the entry point at a function"
        )
    return fn


def load_from_file(spec: str) -> RewardFn:
    """Load ``function`` from ``"path/to/file.py:function"``.

    A relative path is taken from the current working directory.
    """
    path, function = _split_file_spec(spec)
    module = _import_file(path)
    if not hasattr(module, function):
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(
            f"reward file {str(path)!r} has no function {function!r}; define it there or use one of {defined}"
        )
    fn = getattr(module, function)
    if not callable(fn):
        raise ValueError(
            f"{function!r} in reward file {str(path)!r} is a {type(fn).__name__}, not a function; "
            "point the spec at a function"
        )
    return fn


def _split_file_spec(spec: str) -> tuple[Path, str]:
    """The file and function of ``"path/to/file.py:function"``; raises ValueError unless the file exists."""
    path_text, sep, function = spec.rpartition(":")
    if not sep or not path_text:
        raise ValueError(f"reward spec {spec!r} names a file but no function; write '{spec}:function_name'")
    if not function.isidentifier():
        raise ValueError(f"reward spec {spec!r}: {function!r} is not a valid function name")
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ValueError(
            f"reward file {path_text!r} not found (looked at {path.absolute()}); give an absolute path "
            f"or one relative to the working directory {os.getcwd()}"
        )
    return path, function


def _import_file(path: Path) -> ModuleType:
    resolved = path.resolve()
    # A unique module name per file, so two users' "reward.py" files do not clash.
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    module_name = f"mmrl_user_reward_{resolved.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise ValueError(f"reward file {str(path)!r} cannot be loaded as a Python module; give a .py file")
    module = importlib.util.module_from_spec(spec)
    # Registered before running so that dataclasses and pickling inside the file can find the module.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
