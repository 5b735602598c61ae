"""Turning a reward spec from a config into a reward function.

A spec is a string (so that a worker process can resolve it itself), one of:

* a registered name, e.g. ``"answer_match"`` (see :func:`available`), or the name of an installed
  plugin (entry-point group ``mmrl.rewards``);
* ``"path/to/file.py:function"``, a function in a Python file (a relative path is taken from the
  working directory); the file form is parsed and loaded by :mod:`mmrl.plugins.spec`, as tool files are.

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

from collections.abc import Callable
from importlib import metadata
from typing import TypeVar

from mmrl.plugins.spec import entry_points, is_file_spec, load_file_function, split_file_spec
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
        split_file_spec(spec, "reward")
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


def _resolve_name(name: str) -> RewardFn:
    if name in _REGISTRY:
        return _REGISTRY[name]
    entry_point = _plugin_entry_points().get(name)
    if entry_point is None:
        raise ValueError(f"unknown reward {name!r}; valid names: {available()}; or give {_SPEC_FORMS}")
    return register(name)(_load_entry_point(entry_point))


def _plugin_entry_points() -> dict[str, metadata.EntryPoint]:
    return entry_points(ENTRY_POINT_GROUP)


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
    """Load ``function`` from ``"path/to/file.py:function"`` (:func:`mmrl.plugins.spec.load_file_function`).

    A relative path is taken from the current working directory.
    """
    return load_file_function(spec, "reward")
