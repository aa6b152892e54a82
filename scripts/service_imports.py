"""The third-party modules an rlboost service imports, read from its source, and the image smoke test built on it.

A service's code is its package plus every core (`rlboost.*`) module it imports, followed transitively. Every
`import` statement counts, at module level or inside a function (a lazily imported module is still needed at
run time), except those under `if TYPE_CHECKING:` and those inside a `try` that catches ImportError (optional).

    python scripts/service_imports.py rollout_worker
        lists each third-party top-level module and the service's modules that import it
    python scripts/service_imports.py --check rollout_worker --without sglang
        inside an image: every third-party module must be installed (else exit 1, naming each missing one and
        who imports it), then every module of the service is imported; --without names modules this image
        leaves out on purpose (the CPU worker has no sglang), and the modules importing them are not imported

Standard library only: it runs inside images that hold nothing but a service's dependencies, and in
tests/deploy/test_dockerfiles.py to check each pyproject extra covers its service.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

FIRST_PARTY = (
    "rlboost",
    "rlboost_operator",
    "rollout_manager",
    "rollout_worker",
    "trainer",
    "weight_server",
    "env_runner",
)


def package_dir(top: str) -> Path:
    """The directory of a top-level first-party package (found without importing it)."""
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {top!r} is not importable here (install rlboost or set PYTHONPATH)")
    return Path(next(iter(spec.submodule_search_locations)))


def module_file(name: str) -> Path | None:
    """The source file of a first-party module, or None where `name` is no module (an attribute)."""
    top, *rest = name.split(".")
    path = package_dir(top).joinpath(*rest)
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def package_modules(top: str) -> list[str]:
    """Every module of a first-party package, by dotted name."""
    root = package_dir(top)
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names.append(".".join((top, *parts[:-1])) if parts[-1] == "__init__" else ".".join((top, *parts)))
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names):
            return True
    return False


def _required_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements under `node`, skipping TYPE_CHECKING blocks and ImportError-guarded try bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:
                yield from _required_imports(ast.Module(body=[stmt], type_ignores=[]))
        elif isinstance(child, ast.Try) and _catches_import_error(child):
            for stmt in (*child.handlers, *child.orelse, *child.finalbody):
                yield from _required_imports(stmt)
        else:
            yield from _required_imports(child)


def imported_names(module: str, path: Path) -> set[str]:
    """Absolute dotted names `module` imports (for `from a import b`: both `a` and `a.b`)."""
    names: set[str] = set()
    for node in _required_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        names.add(base)
        names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def third_party_imports(service: str) -> dict[str, set[str]]:
    """Third-party top-level module -> the first-party modules (of the service's closure) that import it."""
    found: dict[str, set[str]] = {}
    seen: set[str] = set()
    todo = package_modules(service)
    while todo:
        module = todo.pop()
        path = module_file(module) if module not in seen else None
        if path is None:
            continue
        seen.add(module)
        if "." in module:
            todo.append(module.rsplit(".", 1)[0])  # importing a.b.c runs a/__init__ and a/b/__init__
        for name in imported_names(module, path):
            top = name.split(".")[0]
            if top in FIRST_PARTY:
                todo.append(name)
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.setdefault(top, set()).add(module)
    return found


def check(service: str, without: set[str]) -> int:
    """The image smoke test: every needed third-party module is installed and every service module imports."""
    needed = third_party_imports(service)
    missing = {
        top: users for top, users in needed.items() if top not in without and importlib.util.find_spec(top) is None
    }
    for top, users in sorted(missing.items()):
        print(f"MISSING {top}: imported by {', '.join(sorted(users))}", file=sys.stderr)
    if missing:
        print(
            f"{service}: {len(missing)} module(s) missing; add them to the service's extra in pyproject.toml",
            file=sys.stderr,
        )
        return 1
    optional = {user for top in without for user in needed.get(top, ())}
    modules = [m for m in package_modules(service) if m not in optional]
    for module in modules:
        importlib.import_module(module)
    present = sorted(set(needed) - without)
    print(f"ok {service}: {len(modules)} modules imported; third-party present: {' '.join(present)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("service", choices=FIRST_PARTY[1:], help="the service's top-level package")
    parser.add_argument("--check", action="store_true", help="smoke-test this environment instead of listing")
    parser.add_argument("--without", action="append", default=[], help="a third-party module left out on purpose")
    args = parser.parse_args(argv)
    if args.check:
        return check(args.service, set(args.without))
    for top, users in sorted(third_party_imports(args.service).items()):
        print(f"{top}: {', '.join(sorted(users))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
