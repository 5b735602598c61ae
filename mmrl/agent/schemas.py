"""A tool's JSON schema: declared on its function with :func:`tool`, checked before the tool is offered.

A schema is the function description chat templates take::

    {"name": "rotate", "description": "Rotate an image of the conversation.",
     "parameters": {"type": "object", "properties": {"degrees": {"type": "number"}}, "required": ["degrees"]}}

``parameters`` is a JSON schema (draft 2020-12) of an object; every call's arguments are validated against
it before the tool runs (:mod:`mmrl.agent.calls`). The tool function takes the arguments by name, and may
also take any of :data:`CONTEXT_KEYWORDS`, which mmrl fills (so no argument may have those names):

* ``images``: the episode's images so far (RGB PIL images as stored: the prompt's, then those tools
  returned, in order);
* ``model_image_sizes``: per image, the (width, height) the model saw it at (after its processor resized it);
* ``max_pixels``: the pixel budget of an image the tool returns.

A user's tool, in ``my_tools.py`` (spec ``my_tools.py:rotate``)::

    from mmrl.agent import tool

    @tool("Rotate an image of the conversation.", {"type": "object", "properties": {...}, "required": [...]})
    def rotate(degrees, image=0, *, images):
        return images[image].rotate(degrees, expand=True)

This module is imported by tool worker processes: it imports jsonschema only to check a schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

SCHEMA_ATTR = "__mmrl_tool_schema__"
CONTEXT_KEYWORDS: tuple[str, ...] = ("images", "model_image_sizes", "max_pixels")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_FIX = 'declare it with @mmrl.agent.tool("what it does", {"type": "object", "properties": {...}})'


def tool(description: str, parameters: Mapping[str, Any], name: str | None = None) -> Callable[[F], F]:
    """Declare a function as a tool: its description and the JSON schema of its arguments; ``name`` (default:
    the function's name) is what the model calls it by."""

    def decorator(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"mmrl.agent.tool was applied to {fn!r}, which is not callable")
        schema = {"name": name or fn.__name__, "description": description, "parameters": dict(parameters)}
        setattr(fn, SCHEMA_ATTR, check_schema(schema, getattr(fn, "__qualname__", repr(fn))))
        return fn

    return decorator


def schema_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """The schema :func:`tool` declared on ``fn``; TypeError if it has none."""
    schema = getattr(fn, SCHEMA_ATTR, None)
    if schema is None:
        raise TypeError(f"{getattr(fn, '__qualname__', fn)!r} is not a tool (it has no schema); {_FIX}")
    return schema


def check_schema(schema: object, owner: str) -> dict[str, Any]:
    """``schema`` checked (name, description, parameters a JSON schema of an object whose properties are not
    context keywords, all of it JSON); raises TypeError/ValueError naming ``owner`` and the fix."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(schema, Mapping) or set(schema) - {"name", "description", "parameters"}:
        raise TypeError(f"tool {owner}: its schema must be a dict of name, description and parameters, got "
                        f"{schema!r:.200}")
    name, description, parameters = schema.get("name"), schema.get("description"), schema.get("parameters")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"tool {owner}: name {name!r} must be 1-64 letters, digits, '_' or '-', not starting "
                         "with a digit")
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"tool {owner}: give a description (what the tool does, for the model)")
    if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
        raise ValueError(f"tool {owner}: parameters must be a JSON schema with \"type\": \"object\", got "
                         f"{parameters!r:.200}")
    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError as err:
        raise ValueError(f"tool {owner}: parameters are not a valid JSON schema: {err.message}") from None
    reserved = sorted(set(parameters.get("properties", {})) & set(CONTEXT_KEYWORDS))
    if reserved:
        raise ValueError(f"tool {owner}: arguments {reserved} have the names of context keywords mmrl fills "
                         f"({', '.join(CONTEXT_KEYWORDS)}); rename them")
    try:
        return json.loads(json.dumps({"name": name, "description": description, "parameters": parameters}))
    except (TypeError, ValueError) as err:
        raise TypeError(f"tool {owner}: its schema is not plain JSON ({err})") from None


def function_definition(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A schema in the form ``apply_chat_template(tools=...)`` takes: ``{"type": "function", "function": ...}``."""
    return {"type": "function", "function": dict(schema)}
