"""Turning a reward spec from a config into a reward function.

A spec is a string (so that a worker process can resolve it itself), one of:

* a registered name, e.g. ``"answer_match"`` (see :func:`available`), or the name of an installed
  plugin (entry-point group ``mmrl.rewards``);
* ``"path/to/file.py:function"``, a function in a Python file (a relative path is taken from the
  working directory).

Several of them, weighted (``reward.weights``) or per data source (``reward.verifiers``), are the
reward stage's to combine (:mod:`mmrl.trainer.reward_stage`).

Installed packages add names through the ``mmrl.rewards`` entry-point group,
e.g. in their pyproject.toml::

    [project.entry-points."mmrl.rewards"]
    my_reward = "my_package.rewards:score"

A name registered with :func:`register` by the driver's own code exists in that process only: worker
processes know the built-in names and the installed plugins.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from rewards.types import RewardFn, describe_fn
from rewards.verifiers import BUILTINS

ENTRY_POINT_GROUP = "mmrl.rewards"
_SPEC_FORMS = "a registered name, an installed plugin's name or 'path/to/file.py:function'"

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


def resolve(spec: str | RewardFn) -> RewardFn:
    """The reward function a spec names (a callable is returned as is)."""
    if isinstance(spec, str):
        return load_from_file(spec) if is_file_spec(spec) else _resolve_name(spec)
    if callable(spec):
        return spec
    raise TypeError(f"reward spec must be {_SPEC_FORMS}; got a {type(spec).__name__}: {spec!r}")


def is_file_spec(spec: str) -> bool:
    """Whether ``spec`` names a Python file (``path/to/file.py:function``) rather than a registered name."""
    return spec.endswith(".py") or (":" in spec and spec.rsplit(":", 1)[0].endswith(".py"))


def check_spec(spec: object, for_workers: bool = False) -> None:
    """Check a spec without running any plugin code: its form, that its name is known or its file exists.

    ``for_workers``: also refuse a name registered by this process's own code after ``import rewards``
    (:func:`register`), which a fresh worker process does not know. Raises TypeError or ValueError as
    :func:`resolve` would for the mistakes it can see; whether a file defines the function is only
    known once it is imported.
    """
    if not isinstance(spec, str):
        raise TypeError(f"reward spec must be {_SPEC_FORMS}; got a {type(spec).__name__}: {spec!r}")
    if is_file_spec(spec):
        _split_file_spec(spec)
        return
    plugins = _plugin_entry_points()
    if spec not in _REGISTRY and spec not in plugins:
        raise ValueError(f"unknown reward {spec!r}; valid names: {available()}; or give {_SPEC_FORMS}")
    if for_workers and spec not in BUILTINS and spec not in plugins:
        raise ValueError(
            f"reward {spec!r} was registered by this process's code (rewards.register), so worker processes "
            "do not know it; give it as 'path/to/file.py:function', install it under the 'mmrl.rewards' "
            "entry-point group, or use isolation='inline'"
        )


def absolute_spec(spec: str) -> str:
    """A checked ``spec`` with its file path made absolute, for a process in another directory."""
    if not is_file_spec(spec):
        return spec
    path, _, function = spec.rpartition(":")
    return f"{Path(path).expanduser().absolute()}:{function}"


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
