"""Every bench script still starts: `bench/<name>.py --help` exits 0, and every name it imports exists.

The benches run rarely and by hand, so a renamed function they import goes unnoticed until someone runs
one. Their heavy imports sit inside functions (torch, sglang, gRPC stubs load only when a bench runs), so
`--help` alone does not reach them; the second test resolves every `from X import Y` of each bench against
the code, without running anything.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted((ROOT / "bench").glob("*.py"))
HELP_TIMEOUT_S = 60


def _optional_packages() -> set[str]:
    """Import names of the packages an extra of pyproject.toml pins exactly (trl for `compare`, sglang...): a bench
    may import one inside a function, and `make test`'s environment (the dev extra) need not hold it."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[\[=<>~! ;]", req, maxsplit=1)[0] for reqs in extras.values() for req in reqs}
    return {name.replace("-", "_").lower() for name in names if not name.startswith("rlboost")}


OPTIONAL = _optional_packages()


@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.name)
def test_help_exits_zero(bench: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(bench), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=HELP_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def _imported_names(bench: Path) -> list[tuple[str, str]]:
    """(module, name) of every absolute `from module import name` in the file, at any depth."""
    tree = ast.parse(bench.read_text(), filename=str(bench))
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module != "__future__"
        for alias in node.names
    ]


def _top_level_names(path: Path) -> set[str]:
    """Names a module file defines at its top level (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _resolves(module: str, name: str) -> bool:
    """`from module import name` would work: `name` is a submodule of the package or an attribute of the module (a
    sibling bench module, imported from beside the bench, is read without being run)."""
    sibling = ROOT / "bench" / f"{module}.py"
    if sibling.is_file():
        return name in _top_level_names(sibling)
    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None:  # not installed here: only an extra's package may be missing (it is resolved where installed)
        return module.split(".")[0] in OPTIONAL
    spec = importlib.util.find_spec(module)
    if spec is None:
        return False
    if spec.submodule_search_locations is not None and importlib.util.find_spec(f"{module}.{name}") is not None:
        return True
    return hasattr(importlib.import_module(module), name)


@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.name)
def test_every_imported_name_exists(bench: Path) -> None:
    missing = [f"from {module} import {name}" for module, name in _imported_names(bench) if not _resolves(module, name)]
    assert not missing, f"{bench.name} imports names that do not exist: {missing}"
