"""``warden audit``: query and verify the audit log."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from warden_server.audit import reader
from warden_server.cli.common import CONFIG_OPTION, STORE_OPTION, open_store


@click.group()
def audit() -> None:
    """Query and verify the audit log."""


@audit.command("verify")
@CONFIG_OPTION
@STORE_OPTION
def audit_verify(config_path: str, store: str | None) -> None:
    """Walk the hash chain; name the first bad sequence number."""
    opened = open_store(config_path, store)
    try:
        result = reader.verify(opened)
    finally:
        opened.close()
    if result.ok:
        click.echo(f"ok: {result.checked} records, chain intact")
        return
    click.echo(
        f"TAMPERED at seq {result.first_bad_seq}: {result.problem} "
        f"({result.checked} records verified before it)",
        err=True,
    )
    sys.exit(1)


@audit.command("query")
@CONFIG_OPTION
@STORE_OPTION
@click.option("--since", help="ISO 8601 time, inclusive.")
@click.option("--until", help="ISO 8601 time, exclusive.")
@click.option("--capability", help="Capability id or glob.")
@click.option("--actor")
@click.option("--tenant")
@click.option("--stage")
@click.option("--code")
@click.option("--status")
@click.option(
    "--kind", type=click.Choice(["decision", "outcome", "approval", "policy", "registry"])
)
@click.option("--invocation")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="JSON lines, one object per record.")
def audit_query(config_path: str, store: str | None, as_json: bool, **filters: Any) -> None:
    """Audit records, newest first."""
    opened = open_store(config_path, store)
    try:
        rows = list(reader.query(opened, reader.AuditFilter(**filters)))
    finally:
        opened.close()
    if as_json:
        for row in rows:
            click.echo(json.dumps(row, ensure_ascii=False))
        return
    shown = ("seq", "ts", "kind", "status", "capability_id", "actor_id", "stage", "code", "reason")
    widths = {c: max([len(c), *(len(str(r[c] or "")) for r in rows)]) for c in shown}
    click.echo("  ".join(c.ljust(widths[c]) for c in shown))
    for row in rows:
        click.echo("  ".join(str(row[c] or "").ljust(widths[c]) for c in shown))
