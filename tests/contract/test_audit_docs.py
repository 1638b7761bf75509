"""docs/audit.md and docs/audit-datasette.yml are tested: every command, column
and metric they name exists, and every query they show runs on a real store."""

from __future__ import annotations

import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import ROOT
from tests.integration import auditlog
from warden_server.audit.events import COLUMNS
from warden_server.cli import main
from warden_server.cli.audit import audit
from warden_server.telemetry import Telemetry

DOC = (ROOT / "docs" / "audit.md").read_text()
DATASETTE = yaml.safe_load((ROOT / "docs" / "audit-datasette.yml").read_text())
SQLITE_UTILS = Path(sys.executable).parent / "sqlite-utils"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return auditlog.seeded_store(tmp_path_factory.mktemp("docs") / "warden.db")


@pytest.mark.parametrize("command", sorted(audit.commands))
def test_every_audit_command_has_help_and_is_documented(command: str) -> None:
    assert f"warden audit {command}" in DOC
    result = CliRunner().invoke(main, ["audit", command, "--help"])
    assert result.exit_code == 0 and audit.commands[command].help


def test_the_schema_table_names_every_column() -> None:
    documented = set(re.findall(r"^\| `([a-z_]+)`", DOC, re.MULTILINE)) | {
        name
        for row in re.findall(r"^\| (`[a-z_]+`(?:, `[a-z_]+`)+) \|", DOC, re.MULTILINE)
        for name in re.findall(r"`([a-z_]+)`", row)
    }
    assert set(COLUMNS) <= documented, set(COLUMNS) - documented


def test_every_metric_in_the_docs_exists() -> None:
    exposed = Telemetry().metrics.exposition().decode()
    for name in set(re.findall(r"`(warden_(?!server)[a-z_]+)", DOC)):
        assert (
            f"# TYPE {name.removesuffix('_total')} " in exposed or f"# TYPE {name} " in exposed
        ), name


SQLITE_UTILS_EXAMPLES = [
    shlex.split(line)[3]
    for line in DOC.splitlines()
    if line.startswith("sqlite-utils query var/warden.db ")
]


@pytest.mark.parametrize("sql", SQLITE_UTILS_EXAMPLES)
def test_the_sqlite_utils_examples_run(db: Path, sql: str) -> None:
    assert len(SQLITE_UTILS_EXAMPLES) >= 5
    result = subprocess.run(
        [str(SQLITE_UTILS), "query", str(db), sql], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("[")


@pytest.mark.parametrize("name", sorted(DATASETTE["databases"]["warden"]["queries"]))
def test_the_datasette_canned_queries_run(db: Path, name: str) -> None:
    sql = DATASETTE["databases"]["warden"]["queries"][name]["sql"]
    params = {"since": auditlog.ts(0), "invocation_id": "i-05"}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        conn.execute(sql, {k: v for k, v in params.items() if f":{k}" in sql}).fetchall()
    finally:
        conn.close()
    tables = DATASETTE["databases"]["warden"]["tables"]
    assert set(tables) == {"audit_events", "audit_checkpoints"}
    assert set(tables["audit_events"]["facets"]) <= set(COLUMNS)
