"""A plugin given as ``"path/to/file.py:function"``: checking the form, making it absolute, loading it.

A spec is a string, so that a worker process can resolve it itself. Besides this file form, each kind of
plugin takes names of its own (registered rewards, built-in tools, installed plugins): :mod:`rewards.registry`
and :mod:`mmrl.agent.registry` resolve those, and both read the installed plugins of their entry-point group
through :func:`entry_points`. ``noun`` (``"reward"``, ``"tool"``) names the kind in messages.

A relative path is taken from the working directory; :func:`absolute_spec` fixes it for a worker process
started elsewhere.
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
from typing import Any

# Files of every kind load under this prefix; messages and pickles name the module (it predates tools).
MODULE_PREFIX = "mmrl_user_reward_"


def is_file_spec(spec: str) -> bool:
    """Whether ``spec`` names a Python file (``path/to/file.py:function``) rather than a registered name."""
    return spec.endswith(".py") or (":" in spec and spec.rsplit(":", 1)[0].endswith(".py"))


def absolute_spec(spec: str) -> str:
    """A checked ``spec`` with its file path made absolute, for a process in another directory."""
    if not is_file_spec(spec):
        return spec
    path, _, function = spec.rpartition(":")
    return f"{Path(path).expanduser().absolute()}:{function}"


def split_file_spec(spec: str, noun: str) -> tuple[Path, str]:
    """The file and function of ``"path/to/file.py:function"``; raises ValueError unless the file exists."""
    path_text, sep, function = spec.rpartition(":")
    if not sep or not path_text:
        raise ValueError(f"{noun} spec {spec!r} names a file but no function; write '{spec}:function_name'")
    if not function.isidentifier():
        raise ValueError(f"{noun} spec {spec!r}: {function!r} is not a valid function name")
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ValueError(
            f"{noun} file {path_text!r} not found (looked at {path.absolute()}); give an absolute path "
            f"or one relative to the working directory {os.getcwd()}"
        )
    return path, function


def load_file_function(spec: str, noun: str) -> Callable[..., Any]:
    """The function ``"path/to/file.py:function"`` names; imports the file (runs its code)."""
    path, function = split_file_spec(spec, noun)
    module = import_file(path, noun)
    if not hasattr(module, function):
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(
            f"{noun} file {str(path)!r} has no function {function!r}; define it there or use one of {defined}"
        )
    fn = getattr(module, function)
    if not callable(fn):
        raise ValueError(
            f"{function!r} in {noun} file {str(path)!r} is a {type(fn).__name__}, not a function; "
            "point the spec at a function"
        )
    return fn


def import_file(path: Path, noun: str) -> ModuleType:
    """The module of the Python file at ``path``, imported under a name unique to the file."""
    resolved = path.resolve()
    # A unique module name per file, so two users' "reward.py" files do not clash.
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    module_name = f"{MODULE_PREFIX}{resolved.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise ValueError(f"{noun} file {str(path)!r} cannot be loaded as a Python module; give a .py file")
    module = importlib.util.module_from_spec(spec)
    # Registered before running so that dataclasses and pickling inside the file can find the module.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    """The installed plugins of an entry-point group (e.g. ``mmrl.rewards``), by name; none is loaded."""
    return {ep.name: ep for ep in metadata.entry_points(group=group)}
