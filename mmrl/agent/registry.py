"""Turning a tool spec from a config into the tool's function.

A spec is a string (so that a tool worker process can resolve it itself), one of:

* a built-in name: ``crop``, ``zoom_in``, ``calculator`` (:mod:`mmrl.agent.builtin`);
* the name of an installed plugin, from the entry-point group ``mmrl.tools``, e.g. in a package's
  pyproject.toml::

      [project.entry-points."mmrl.tools"]
      rotate = "my_package.tools:rotate"

* ``"path/to/file.py:function"``, a function in a Python file (a relative path is taken from the working
  directory; :func:`absolute_spec` fixes it for workers).

The function must carry its schema (:func:`mmrl.agent.tool`). The driver only checks a spec's form
(:func:`check_spec`); the plugin's code runs in the workers, which load it with :func:`resolve`.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from mmrl.agent.builtin import BUILTINS
from mmrl.agent.schemas import schema_of
from rewards.registry import _import_file, absolute_spec, is_file_spec  # the file-spec form is shared with rewards

ENTRY_POINT_GROUP = "mmrl.tools"
_SPEC_FORMS = ("a built-in tool's name, an installed plugin's name (entry points 'mmrl.tools') or "
               "'path/to/file.py:function'")

__all__ = ["ENTRY_POINT_GROUP", "absolute_spec", "available", "check_spec", "resolve"]


def available() -> list[str]:
    """The names :func:`resolve` accepts: the built-in tools and the installed plugins."""
    return sorted(set(BUILTINS) | set(_entry_points()))


def check_spec(spec: object) -> None:
    """Check a spec's form without running plugin code: a known name, or a file that exists and a function name.
    Raises TypeError or ValueError naming the fix."""
    if not isinstance(spec, str):
        raise TypeError(f"tool spec must be {_SPEC_FORMS}; got a {type(spec).__name__}: {spec!r}")
    if is_file_spec(spec):
        _split(spec)
    elif spec not in BUILTINS and spec not in _entry_points():
        raise ValueError(f"unknown tool {spec!r}; valid names: {available()}; or give {_SPEC_FORMS}")


def resolve(spec: str) -> Callable[..., Any]:
    """The tool function a spec names (imports a plugin's code); it must carry a schema."""
    check_spec(spec)
    if spec in BUILTINS:
        return BUILTINS[spec]
    fn = _from_file(spec) if is_file_spec(spec) else _from_entry_point(_entry_points()[spec])
    schema_of(fn)  # a function without a schema is refused on load, not on its first call
    return fn


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _from_entry_point(entry_point: metadata.EntryPoint) -> Callable[..., Any]:
    fn = entry_point.load()
    if not callable(fn):
        raise ValueError(f"tool plugin {entry_point.name!r} points at {entry_point.value!r}, which is not callable; "
                         "point the entry point at a function")
    return fn


def _split(spec: str) -> tuple[Path, str]:
    path_text, _, function = spec.rpartition(":")
    if not path_text or not function:
        raise ValueError(f"tool spec {spec!r} names a file but no function; write '{spec}:function_name'")
    if not function.isidentifier():
        raise ValueError(f"tool spec {spec!r}: {function!r} is not a valid function name")
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ValueError(f"tool file {path_text!r} not found (looked at {path.absolute()}); give an absolute path or "
                         "one relative to the working directory")
    return path, function


def _from_file(spec: str) -> Callable[..., Any]:
    path, function = _split(spec)
    module = _import_file(path)
    fn = getattr(module, function, None)
    if not callable(fn):
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(f"tool file {str(path)!r} has no function {function!r}; define it there or use one of "
                         f"{defined}")
    return fn
