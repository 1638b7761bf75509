"""``warden``: a thin click layer over the plane's library.

Domain errors become ``click.ClickException`` here, at the edge, and nowhere else.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from warden_server.audit import reader
from warden_server.auth.actors import mint_token
from warden_server.config import Config, ConfigError, load_config
from warden_server.policy.loader import PolicyLoadError, load_policies
from warden_server.policy.testing import run_policy_tests
from warden_server.store import SQLiteStore

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default="warden.toml",
    show_default=True,
    help="The plane's TOML configuration.",
)


def _config(path: str, **overrides: str | None) -> Config:
    try:
        return load_config(path, environ=os.environ, overrides=overrides)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
@click.version_option(package_name="warden")
def main() -> None:
    """Warden: a policy-as-code governance plane for the operations AI models may call."""


@main.command()
@CONFIG_OPTION
@click.option("--listen", help="host:port to serve on (overrides [server] listen).")
@click.option("--store", help="SQLite store path (overrides [server] store).")
@click.option("--policies", help="Policy folder (overrides [server] policies).")
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
)
def serve(
    config_path: str, listen: str | None, store: str | None, policies: str | None, log_level: str
) -> None:
    """Serve the plane until interrupted."""
    from warden_server.app import serve as start
    from warden_server.plane import Plane

    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = _config(config_path, listen=listen, store=store, policies=policies)
    try:
        plane = Plane.from_config(config)
    except PolicyLoadError as exc:
        raise click.ClickException(f"the policy set has problems:\n{exc}") from None
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    try:
        server = start(plane, config.server.listen)
    except OSError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"warden serving on {server.target} (store {config.store_path}, "
        f"policies {config.policies_path})",
        err=True,
    )

    def stop(signum: int, _frame: Any) -> None:
        click.echo(f"received {signal.Signals(signum).name}, stopping", err=True)
        server.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.wait()


@main.group()
def token() -> None:
    """Development actor tokens."""


@token.command("mint")
@CONFIG_OPTION
@click.option("--sub", required=True, help="The actor id (JWT subject).")
@click.option("--role", "roles", multiple=True, help="A role; repeat for several.")
@click.option("--tenant", default="", help="The actor's tenant.")
@click.option(
    "--attr",
    "attrs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A free attribute claim; repeat for several.",
)
@click.option("--ttl", default=3600, show_default=True, help="Lifetime in seconds.")
def token_mint(
    config_path: str,
    sub: str,
    roles: tuple[str, ...],
    tenant: str,
    attrs: tuple[str, ...],
    ttl: int,
) -> None:
    """Print a development JWT signed with the config's HS256 secret."""
    config = _config(config_path)
    claims: dict[str, str] = {}
    for item in attrs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--attr")
        claims[key] = value
    try:
        click.echo(
            mint_token(
                config, subject=sub, roles=roles, tenant=tenant, attrs=claims, ttl_seconds=ttl
            )
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@main.group()
def policy() -> None:
    """Check and test policy files."""


@policy.command("check")
@click.argument("directory", type=click.Path(file_okay=False), default="policies")
def policy_check(directory: str) -> None:
    """Report every problem in a policy folder, each as file:line:col."""
    try:
        policies = load_policies(directory)
    except PolicyLoadError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(1) from None
    click.echo(
        f"ok: {len(policies.rules)} rules in {len(policies.files)} files "
        f"(revision {policies.revision[:12]})"
    )


@policy.command("test")
@click.argument("directory", type=click.Path(file_okay=False), default="policies")
@click.option("--run", "pattern", help="Run only the tests whose name matches this regex.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option(
    "--min-coverage",
    type=click.FloatRange(0, 100),
    default=0.0,
    help="Fail below this percentage of rules exercised.",
)
def policy_test(directory: str, pattern: str | None, as_json: bool, min_coverage: float) -> None:
    """Run the test cases in DIRECTORY/tests against the policies in DIRECTORY."""
    try:
        policies = load_policies(directory)
    except PolicyLoadError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(1) from None
    report = run_policy_tests(policies, directory, pattern=pattern)
    for problem in report.problems:
        click.echo(str(problem), err=True)
    for case in report.cases:
        if as_json:
            click.echo(json.dumps(case.to_json()))
        else:
            mark = "PASS" if case.passed else "FAIL"
            line = f"{mark}  {case.name}"
            if not case.passed:
                line += f"\n      expected {case.expected}\n      got      {case.actual}"
            click.echo(line)
    coverage = report.coverage * 100
    summary = (
        f"{len(report.cases) - len(report.failed)} passed, {len(report.failed)} failed; "
        f"rule coverage {coverage:.0f}% ({len(report.exercised & set(report.rules))}"
        f"/{len(report.rules)})"
    )
    if as_json:
        click.echo(json.dumps({"summary": summary, "unexercised": report.unexercised}))
    else:
        if report.unexercised:
            click.echo("rules no test exercised: " + ", ".join(report.unexercised))
        click.echo(summary)
    if not report.cases:
        click.echo("no test cases found", err=True)
    if not report.ok or coverage < min_coverage:
        raise SystemExit(1)


@main.group()
def audit() -> None:
    """Query and verify the audit log."""


STORE_OPTION = click.option("--store", help="The SQLite store (default: the config's).")


def _store(config_path: str, store: str | None) -> SQLiteStore:
    path = Path(store) if store else _config(config_path).store_path
    if not path.exists():
        raise click.ClickException(f"{path}: no such store")
    return SQLiteStore(path)


@audit.command("verify")
@CONFIG_OPTION
@STORE_OPTION
def audit_verify(config_path: str, store: str | None) -> None:
    """Walk the hash chain; name the first bad sequence number."""
    opened = _store(config_path, store)
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
    opened = _store(config_path, store)
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
