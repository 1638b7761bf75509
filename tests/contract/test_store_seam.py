"""The store seam is one-way: ``store/`` is the only package that speaks SQL,
and it builds on leaf modules alone (never on ``audit/`` or the pipeline), so
another store can stand behind the same interfaces."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "server" / "warden_server"
STORE_MAY_IMPORT = (
    "warden_server.store",
    "warden_server.records",
    "warden_server.errors",
    "warden_server.keyfiles",
)
"""What ``store/`` may import of the plane: itself and leaf modules."""
LEAVES = ("warden_server.records", "warden_server.errors", "warden_server.keyfiles")
DATABASE_DRIVERS = {"sqlite3", "sqlite_utils", "psycopg", "psycopg_pool"}
SQL = re.compile(
    r"\bSELECT\b.*\bFROM\b|\bINSERT\s+(OR\s+\w+\s+)?INTO\b|\bUPDATE\s+\w+\s+SET\b"
    r"|\bDELETE\s+FROM\b|\bCREATE\s+(UNIQUE\s+)?(TABLE|INDEX)\b|\bPRAGMA\s+\w+"
    r"|\b\w+\s*(=|<|>|<=|>=|IN)\s*\(?:[a-z_]\w*",
    re.DOTALL,
)
"""Statements, and WHERE fragments with bound (``:name``) parameters."""


def _modules() -> Iterator[tuple[str, Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path, ast.parse(path.read_text(), str(path))


def _imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def _texts(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every string constant, and every f-string with its holes left empty."""
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v.value for v in node.values if isinstance(v, ast.Constant)]
            yield node.lineno, "".join(str(p) for p in parts)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def test_no_import_runs_from_the_store_to_the_rest_of_the_plane() -> None:
    found = [
        f"{_where(path, line)} imports {imported}"
        for name, path, tree in _modules()
        if _within(name, "warden_server.store")
        for line, imported in _imports(tree)
        if _within(imported, "warden_server")
        and not any(_within(imported, allowed) for allowed in STORE_MAY_IMPORT)
    ]
    assert found == []


def test_the_leaf_modules_import_nothing_of_the_plane() -> None:
    found = [
        f"{_where(path, line)} imports {imported}"
        for name, path, tree in _modules()
        if any(_within(name, leaf) for leaf in LEAVES)
        for line, imported in _imports(tree)
        if _within(imported, "warden_server") and not _within(imported, "warden_server.records")
    ]
    assert found == []


def test_only_the_store_imports_a_database_driver() -> None:
    found = [
        f"{_where(path, line)} imports {imported}"
        for name, path, tree in _modules()
        if not _within(name, "warden_server.store")
        for line, imported in _imports(tree)
        if imported.split(".")[0] in DATABASE_DRIVERS
    ]
    assert found == []


def test_only_the_store_contains_sql() -> None:
    found = [
        f"{_where(path, line)}: {text.strip()[:60]!r}"
        for name, path, tree in _modules()
        if not _within(name, "warden_server.store")
        for line, text in _texts(tree)
        if SQL.search(text)
    ]
    assert found == []


def test_the_sql_detector_sees_what_the_audit_reader_used_to_splice() -> None:
    # What audit/reader.py and audit/retention.py passed to the store before the seam.
    spliced = ("ts >= :cutoff", "seq <= :end", "tenant IN (:scope0)", "SELECT 1 FROM audit_events")
    for text in spliced:
        assert SQL.search(text), text
    assert not SQL.search("SELECT to non-message"), "a CEL error message is not SQL"
