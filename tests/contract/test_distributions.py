"""The two Python distributions: `warden` (client/, the SDK) depends on exactly
what the SDK imports, and `warden-server` (the plane) is released with it."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

SDK = ROOT / "client" / "warden"
EXTRA_ONLY = {SDK / "adapters" / "mcp.py": "mcp"}
"""Modules whose third-party imports belong to an extra, not to the SDK's dependencies."""
BROUGHT_BY = {"pydantic-core": "pydantic", "anyio": "mcp"}
"""Imported distributions that a declared dependency pins for the SDK."""


def project(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    return document


def normalized(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group()).lower()


@cache
def distribution_of_files() -> dict[str, str]:
    """Installed module paths (``google/protobuf/timestamp_pb2.py``) and their distribution."""
    owners = {}
    for dist in importlib.metadata.distributions():
        name = normalized(dist.metadata["Name"])  # parsed from the file at each reading
        for file in dist.files or ():
            owners[file.as_posix()] = name
    return owners


@cache
def distributions_of_folders() -> dict[str, set[str]]:
    """Each folder of installed files (``google/protobuf``), and the distributions
    with files under it."""
    owners: dict[str, set[str]] = {}
    for path, dist in distribution_of_files().items():
        folder = path
        while "/" in folder:
            folder = folder.rpartition("/")[0]
            owners.setdefault(folder, set()).add(dist)
    return owners


def distribution_of(module: str) -> str | None:
    """The distribution a module comes from, the deepest importable name first
    (``opentelemetry`` is shared by several distributions, ``opentelemetry.trace`` is not)."""
    parts = module.split(".")
    for depth in range(len(parts), 0, -1):
        base = "/".join(parts[:depth])
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if path in distribution_of_files():
                return distribution_of_files()[path]
        owners = distributions_of_folders().get(base, set())
        if len(owners) == 1:
            return next(iter(owners))
    return None


def imports(path: Path) -> set[str]:
    """Absolute imports of a module, ``from a import b`` as ``a.b``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def third_party(path: Path) -> set[str]:
    return {
        module
        for module in imports(path)
        if module.split(".")[0] not in sys.stdlib_module_names
        and module.split(".")[0] not in {"warden", "__future__"}
    }


def test_the_sdk_depends_on_exactly_what_it_imports() -> None:
    needed: dict[str, set[str]] = {}
    for path in sorted(SDK.rglob("*.py")):
        for module in third_party(path):
            owner = distribution_of(module)
            assert owner, f"{path.relative_to(ROOT)}: {module} comes from no installed distribution"
            owner = BROUGHT_BY.get(owner, owner)
            needed.setdefault(EXTRA_ONLY.get(path, ""), set()).add(owner)
    sdk = project(ROOT / "client" / "pyproject.toml")
    assert {normalized(r) for r in sdk["dependencies"]} == needed[""]
    extras = {
        name: {normalized(r) for r in requirements}
        for name, requirements in sdk["optional-dependencies"].items()
    }
    assert extras == {"mcp": needed["mcp"] - needed[""]}


def test_the_sdk_never_imports_the_plane() -> None:
    reaching = [
        str(path.relative_to(ROOT))
        for path in SDK.rglob("*.py")
        if any(module.split(".")[0] == "warden_server" for module in imports(path))
    ]
    assert reaching == []


def test_the_plane_is_released_with_the_sdk_of_its_version() -> None:
    sdk = project(ROOT / "client" / "pyproject.toml")
    server = project(ROOT / "pyproject.toml")
    assert (sdk["name"], server["name"]) == ("warden", "warden-server")
    assert f"warden=={sdk['version']}" in server["dependencies"]
    assert server["version"] == sdk["version"]
    assert set(server["dependencies"]).isdisjoint(sdk["dependencies"]), (
        "what both need is declared once, by the SDK"
    )
    assert server["scripts"] == {"warden": "warden_server.cli:main"}
    assert "warden[mcp]" in server["optional-dependencies"]["dev"]
