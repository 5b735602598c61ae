"""The layout's rules, read from the source: no import circles among mmrl's packages, no module in mmrl/ over 400
lines, and a trainer step that is short and reads no mode, algorithm name or agent flag."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("mmrl", "rewards", "data_prep", "pipelines", "benchmarks")


def module_files() -> dict[str, Path]:
    """Every module of the project's packages by dotted name (a package by its own name)."""
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(node: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The project modules an import statement names (``from a import b`` names ``a.b`` when that is a module)."""
    names = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                 for alias in node.names]
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its body (at load time or inside a function)."""
    modules = module_files()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        graph[name] = {target for node in ast.walk(tree) for target in imported(node, modules)} - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_a_from_import_names_the_module_or_its_package():
    modules = {"pkg": Path(), "pkg.sub": Path()}
    assert imported(ast.parse("from pkg import sub").body[0], modules) == {"pkg.sub"}
    assert imported(ast.parse("from pkg import name").body[0], modules) == {"pkg"}
    assert imported(ast.parse("import pkg.sub.deeper").body[0], modules) == {"pkg.sub"}


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_no_module_in_mmrl_is_over_400_lines():
    long = {str(path.relative_to(ROOT)): n for path in (ROOT / "mmrl").rglob("*.py")
            if (n := len(path.read_text().splitlines())) > 400}
    assert long == {}


def dotted(node: ast.AST) -> str:
    """``a.b.c`` of an attribute chain (empty for anything else)."""
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return node.id if isinstance(node, ast.Name) else ""


def test_the_trainer_step_is_short_and_branches_on_no_mode():
    """No test (if, conditional, comparison, table key) in the trainer's module reads the mode, the agent flag or
    the algorithm's name; the step fits in 25 lines."""
    from mmrl.trainer import rl

    assert len(inspect.getsource(rl.RLTrainer.step).splitlines()) <= 25
    tests = []
    for node in ast.walk(ast.parse(inspect.getsource(rl))):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            tests.append(node.test)
        elif isinstance(node, (ast.Compare, ast.BoolOp)):
            tests.append(node)
        elif isinstance(node, ast.Subscript):
            tests.append(node.slice)
    read = {dotted(inner) for test in tests for inner in ast.walk(test) if isinstance(inner, ast.Attribute)}
    for flag in ("trainer.mode", "agent.enabled", "algorithm.name"):
        assert not any(name.endswith(flag) for name in read), flag


def test_the_branch_finder_sees_a_mode_check():
    tree = ast.parse("if cfg.trainer.mode == 'async':\n    pass")
    test = next(node for node in ast.walk(tree) if isinstance(node, ast.If)).test
    assert "cfg.trainer.mode" in {dotted(n) for n in ast.walk(test) if isinstance(n, ast.Attribute)}
