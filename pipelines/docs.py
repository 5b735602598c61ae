"""Stage ``make docs``: the config reference, docs/config.md, generated from the config dataclasses.

Every key of :class:`mmrl.config.Config` gets one row: its dotted name, its type, its default, its bounds and
its doc; the sections mmrl.config gathers from the tables (``actor.loss.<name>``, ``algorithm.<name>``) are
dataclasses like the others. The doc of a field is the string literal right after it in its class body (read from the source with
``ast``, from the class itself or the nearest base class that declares it); the bounds are the field's
``metadata["bounds"]``. A field whose metadata says ``"key": False`` is no config key and is left out. There
is one table per section: a dataclass under ``Config`` (``actor``), or one under a section (``actor.lora``).

The output depends only on the dataclasses, so it is the same on every run. ``--check`` writes nothing and
exits with 1 when docs/config.md differs from what it would write (a test does the same check).

    python -m pipelines.docs            # writes docs/config.md
    python -m pipelines.docs --check    # exits 1 when docs/config.md is out of date
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import re
import sys
import textwrap
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mmrl.config import Config
from mmrl.config_fields import Bounds

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "config.md"

HEADER = """\
# Config reference

Generated from the dataclasses in `mmrl/config/` (and the sections it gathers from the loss and algorithm
tables, each declared in its loss's or algorithm's module) by `make docs` (`python -m pipelines.docs`). Do not
edit this file by hand: change the field or its docstring, then run `make docs`. `make test` fails when this file
is out of date (`tests/unit/test_docs.py`).

A key is set in three layers, each over the one before: the default below, a YAML file under `configs/`
(which may extend another with `base: other.yaml`), then `section.key=value` on the command line:

```bash
make rl CONFIG=configs/grpo_image.yaml ARGS="rollout.n=8 actor.lr=1e-4"
```

An unknown key, a value of the wrong type, a value outside its bounds, NaN or infinity stops the stage before
anything starts, with a message that names the key. Bounds: `[a, b]` includes both ends, `(a, b]` excludes
`a`; `finite` is any finite number. A micro-batch size marked `0 = auto` is sized by each worker from its
model and memory (`mmrl/memory/budget.py`); `auto` is accepted as a spelling of 0. Some keys belong to one algorithm
or one loss: setting one that the chosen algorithm does not read is refused ([algorithms.md](algorithms.md)).
"""


@dataclass(frozen=True)
class Key:
    """One config key: a row of the reference."""

    name: str
    type: str
    default: str
    bounds: str
    doc: str


@dataclass(frozen=True)
class Section:
    """One table: the keys of one dataclass, under its dotted name ("" for the top level)."""

    name: str
    intro: str
    keys: tuple[Key, ...]


# ---------------------------------------------------------------------------------------------------
# Reading the dataclasses


def config_fields(cls: type) -> list[dataclasses.Field]:
    """The config keys of a dataclass, inherited ones included, in declaration order."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("key", True)]


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the string literal right after the field in ``cls``'s own body (by ``ast``)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)).body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = after.value.value
    return docs


def doc_of(cls: type, name: str) -> str:
    """The docstring of field ``name``: from ``cls``, else from the nearest base class that documents it."""
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass) and name in field_docs(klass):
            return field_docs(klass)[name]
    return ""


def class_doc(cls: type) -> str:
    """The class's own docstring (not a base's, nor the one dataclasses makes up)."""
    doc = cls.__dict__.get("__doc__") or ""
    return "" if doc.startswith(f"{cls.__name__}(") else doc


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def walk(cls: type = Config, prefix: str = "") -> list[Section]:
    """The sections of ``cls``: its own keys first, then each nested dataclass's, depth first."""
    hints = typing.get_type_hints(cls)
    keys, nested = [], []
    for f in config_fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            nested.append((f, tp))
            continue
        keys.append(Key(name=f"{prefix}{f.name}", type=type_text(tp), default=value_text(default_of(f)),
                        bounds=bounds_text(f.metadata), doc=prose(doc_of(cls, f.name))))
    intro = prose(class_doc(cls)) if prefix else ""
    sections = [Section(prefix.rstrip("."), intro, tuple(keys))] if keys else []
    for f, tp in nested:
        inner = walk(tp, f"{prefix}{f.name}.")
        if inner and inner[0].name == f"{prefix}{f.name}":
            intro = " ".join(part for part in (prose(doc_of(cls, f.name)), inner[0].intro) if part)
            inner[0] = dataclasses.replace(inner[0], intro=intro)
        sections.extend(inner)
    return sections


# ---------------------------------------------------------------------------------------------------
# Text


def type_text(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " or ".join(f"`{value}`" for value in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_text(arg) for arg in args)
    if origin is not None:
        return f"`{origin.__name__}[{', '.join(type_text(arg).strip('`') for arg in args)}]`"
    return f"`{getattr(tp, '__name__', str(tp))}`"


def value_text(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "(required)"
    if isinstance(value, bool):
        return f"`{'true' if value else 'false'}`"
    if isinstance(value, (frozenset, set)):
        value = sorted(value)
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def number(x: float) -> str:
    return f"{x:g}"


def bounds_text(metadata: Any) -> str:
    bounds: Bounds | None = metadata.get("bounds")
    if bounds is None:
        return ""
    low = None
    if bounds.gt is not None:
        low = f"({number(bounds.gt)}"
    elif bounds.ge is not None:
        low = f"[{number(bounds.ge)}"
    if low is not None and bounds.le is not None:
        text = f"{low}, {number(bounds.le)}]"
    elif low is not None:
        text = f"> {number(bounds.gt)}" if bounds.gt is not None else f">= {number(bounds.ge)}"
    elif bounds.le is not None:
        text = f"<= {number(bounds.le)}"
    else:
        text = "finite"
    return text + (", `0` = auto" if metadata.get("auto") else "")


def prose(doc: str) -> str:
    """A docstring as one line of markdown: reST roles and double backticks become code spans."""
    text = " ".join(inspect.cleandoc(doc).split())
    text = re.sub(r":(?:mod|func|class|meth|data|attr):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(cls: type = Config) -> str:
    """The whole of docs/config.md for the config class ``cls``."""
    sections = walk(cls)
    lines = [HEADER, "## Sections", ""]
    lines += [f"- [{s.name or 'top level'}](#{anchor(s.name or 'top level')})" for s in sections]
    for s in sections:
        lines += ["", f"{'###' if '.' in s.name else '##'} {s.name or 'top level'}", ""]
        if s.intro:
            lines += [s.intro, ""]
        lines += ["| key | type | default | bounds | doc |", "|---|---|---|---|---|"]
        lines += [f"| `{k.name}` | {cell(k.type)} | {cell(k.default)} | {cell(k.bounds)} | {cell(k.doc)} |"
                  for k in s.keys]
    return "\n".join(lines) + "\n"


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


# ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/config.md is out of date")
    parser.add_argument("--out", type=Path, default=OUTPUT, help="the file to write or check")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text() if args.out.is_file() else None
        if current != text:
            print(f"{args.out} is out of date with mmrl/config.py: run `make docs` "
                  "(python -m pipelines.docs)", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}: {sum(len(s.keys) for s in walk())} keys in {len(walk())} sections")
    return 0


if __name__ == "__main__":
    sys.exit(main())
