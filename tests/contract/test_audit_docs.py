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
from warden_server.cli import main
from warden_server.cli.audit import audit
from warden_server.records.events import COLUMNS
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


AUDIT_TABLES = {"audit_events", "audit_checkpoints"}


def _tables_read(db: Path, sql: str) -> set[str]:
    """The tables a query reads, as SQLite's authorizer sees them when it prepares it."""
    read: set[str] = set()

    def authorize(action: int, table: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_READ and table:
            read.add(table)
        return sqlite3.SQLITE_OK

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        conn.set_authorizer(authorize)
        conn.execute(f"EXPLAIN {sql}", {"since": "", "invocation_id": ""}).fetchall()
    finally:
        conn.close()
    return read


def test_datasette_shows_only_the_audit_tables(db: Path) -> None:
    """The store also holds approvals with their inputs, idempotency keys and the
    registry: Datasette must deny them, and free SQL, which could read them."""
    database = DATASETTE["databases"]["warden"]
    assert database.get("allow") is False, "every table not listed must be denied"
    assert database.get("allow_sql") is False, "free SQL could read any table"
    assert set(database["tables"]) <= AUDIT_TABLES
    assert all(table.get("allow") is True for table in database["tables"].values())
    stored = {
        name
        for (name,) in sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table'"
        )
    }
    assert {"approvals", "idempotency_keys", "capabilities"} <= stored  # what is hidden
    for name, canned in database["queries"].items():
        assert canned.get("allow") is True, name
        assert _tables_read(db, canned["sql"]) <= AUDIT_TABLES, name


def test_the_front_page_links_every_table_and_canned_query_it_shows() -> None:
    """The database page is denied with the rest, so a table or a canned query
    the front page does not link is reachable only by typing its address."""
    database = DATASETTE["databases"]["warden"]
    shown = {*database["tables"], *database["queries"]}
    linked = set(re.findall(r'href="/warden/([a-z_]+)"', DATASETTE["description_html"]))
    assert linked == shown


def test_the_docs_say_that_reading_the_file_bypasses_tenant_scoping() -> None:
    section = DOC.split("## Browsing with Datasette", 1)[1].split("\n## ", 1)[0]
    datasette = " ".join(section.split())
    assert "bypasses the audit API's tenant scoping" in datasette
    assert "auditor:all" in datasette
