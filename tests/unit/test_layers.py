"""The library's layers point down: the config module imports, of the library, only the loss and algorithm tables
it gathers sections from, and the library never imports its preprocessing package."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_loading_a_config_imports_only_the_tables_it_gathers_sections_from():
    """The config gathers each loss's section and each algorithm's from their tables (mmrl.algos.losses,
    mmrl.algos.table: the loss functions and the algorithm classes, with torch); it imports no model, rollout,
    worker, trainer, reward or preprocessing code."""
    watched = "('mmrl', 'rewards', 'data_prep')"
    code = ("import sys, mmrl.config as c\n"
            "c.load_config('configs/algos/vapo.yaml', ['rollout.n=4']).check()\n"
            f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {watched})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    imported = out.stdout.split()
    below = ("mmrl", "mmrl.config", "mmrl.config_fields", "mmrl.protocol", "mmrl.trajectory")
    assert {"mmrl.config", "mmrl.algos.losses", "mmrl.algos.table"} <= set(imported)
    assert [m for m in imported if m not in below and not m.startswith(("mmrl.algos", "mmrl.config."))] == []


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in ``path`` names (top level or inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_library_does_not_import_the_preprocessing_package():
    files = sorted((ROOT / "mmrl").rglob("*.py"))
    assert len(files) > 50
    offenders = {str(f.relative_to(ROOT)): [m for m in imported_modules(f) if m.split(".")[0] == "data_prep"]
                 for f in files}
    assert not {f: m for f, m in offenders.items() if m}


def string_constants(path: Path) -> list[str]:
    """The string literals of ``path``, docstrings (every bare string statement) left out."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def test_the_answer_tag_is_spelled_in_one_place():
    """Code that writes or reads ``<answer>`` imports the format from mmrl/answer_format.py, which spells the
    tag once (as ``ANSWER_TAG``)."""
    files = [f for package in ("mmrl", "rewards", "data_prep", "pipelines", "benchmarks")
             for f in sorted((ROOT / package).rglob("*.py"))]
    spelled = {str(f.relative_to(ROOT)): [s for s in string_constants(f) if "answer>" in s] for f in files}
    assert not {f: s for f, s in spelled.items() if s}
