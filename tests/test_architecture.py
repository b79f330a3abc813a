"""The package's architecture, checked: layers and cycles (import-linter's contracts in
pyproject.toml), no private names imported across subpackages, and the size limits that keep
modules readable (docs/architecture.md)."""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "bilevel"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: pathlib.Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _resolve(node: ast.ImportFrom, path: pathlib.Path) -> str:
    if not node.level:
        return node.module or ""
    base = _package_of(path).split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _sources():
    return sorted(SRC.rglob("*.py"))


def test_import_contracts_hold():
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    proc = subprocess.run([exe], cwd=SRC.parents[1], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_no_private_names_imported_across_subpackages():
    """``from a.b import _x`` is allowed only inside a.b's own subpackage (its top-level layer
    package, e.g. ``bilevel.drivers``): a private name is an implementation detail of its
    subpackage, and a module that needs it from elsewhere needs a public interface instead."""
    offenders = []
    for path in _sources():
        own = _module_name(path).split(".")[:2]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _resolve(node, path)
            if not target.startswith("bilevel"):
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and target.split(".")[:2] != own:
                    offenders.append(f"{_module_name(path)}: from {target} import {alias.name}")
    assert not offenders, "\n".join(offenders)
