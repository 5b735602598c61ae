"""Turning a tool spec from a config into the tool's function.

A spec is a string (so that a tool worker process can resolve it itself), one of:

* a built-in name: ``crop``, ``zoom_in``, ``calculator`` (:mod:`mmrl.agent.builtin`);
* the name of an installed plugin, from the entry-point group ``mmrl.tools``, e.g. in a package's
  pyproject.toml::

      [project.entry-points."mmrl.tools"]
      rotate = "my_package.tools:rotate"

* ``"path/to/file.py:function"``, a function in a Python file (a relative path is taken from the working
  directory; :func:`mmrl.plugins.spec.absolute_spec` fixes it for workers). The file form is parsed and
  loaded by :mod:`mmrl.plugins.spec`, as reward files are.

The function must carry its schema (:func:`mmrl.agent.tool`). The driver only checks a spec's form
(:func:`check_spec`); the plugin's code runs in the workers, which load it with :func:`resolve`.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

from mmrl.agent.builtin import BUILTINS
from mmrl.agent.schemas import schema_of
from mmrl.plugins.spec import entry_points, is_file_spec, load_file_function, split_file_spec

ENTRY_POINT_GROUP = "mmrl.tools"
_SPEC_FORMS = ("a built-in tool's name, an installed plugin's name (entry points 'mmrl.tools') or "
               "'path/to/file.py:function'")

__all__ = ["ENTRY_POINT_GROUP", "available", "check_spec", "resolve"]


def available() -> list[str]:
    """The names :func:`resolve` accepts: the built-in tools and the installed plugins."""
    return sorted(set(BUILTINS) | set(entry_points(ENTRY_POINT_GROUP)))


def check_spec(spec: object) -> None:
    """Check a spec's form without running plugin code: a known name, or a file that exists and a function name.
    Raises TypeError or ValueError naming the fix."""
    if not isinstance(spec, str):
        raise TypeError(f"tool spec must be {_SPEC_FORMS}; got a {type(spec).__name__}: {spec!r}")
    if is_file_spec(spec):
        split_file_spec(spec, "tool")
    elif spec not in BUILTINS and spec not in entry_points(ENTRY_POINT_GROUP):
        raise ValueError(f"unknown tool {spec!r}; valid names: {available()}; or give {_SPEC_FORMS}")


def resolve(spec: str) -> Callable[..., Any]:
    """The tool function a spec names (imports a plugin's code); it must carry a schema."""
    check_spec(spec)
    if spec in BUILTINS:
        return BUILTINS[spec]
    if is_file_spec(spec):
        fn = load_file_function(spec, "tool")
    else:
        fn = _from_entry_point(entry_points(ENTRY_POINT_GROUP)[spec])
    schema_of(fn)  # a function without a schema is refused on load, not on its first call
    return fn


def _from_entry_point(entry_point: metadata.EntryPoint) -> Callable[..., Any]:
    fn = entry_point.load()
    if not callable(fn):
        raise ValueError(f"tool plugin {entry_point.name!r} points at {entry_point.value!r}, which is not callable; "
                         "point the entry point at a function")
    return fn
