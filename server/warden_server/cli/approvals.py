"""``warden approvals``: list, show, approve and deny approvals, as an approver.

A thin layer over the SDK's ``warden.Approvals`` client: the commands talk to
a running plane with the approver's own JWT.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import click
import jwt

import warden
from warden_server.approvals.deciding import MAX_LIST
from warden_server.cli.common import TARGET_OPTION, plane_refused, required_token

STATES = ("pending", "approved", "denied", "expired", "consumed")
TOKEN_OPTION = click.option(
    "--token",
    envvar="WARDEN_TOKEN",
    callback=required_token,
    help="The approver's JWT (or set WARDEN_TOKEN, which keeps it out of the process list).",
)
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="JSON, one object per line.")
_COLUMNS = ("id", "state", "capability", "requester", "expires", "decide", "message")


@click.group()
def approvals() -> None:
    """List, show, approve and deny approvals (as the approver the token names)."""


@contextmanager
def _client(target: str, token: str) -> Iterator[warden.Approvals]:
    """The client, with the plane's refusals turned into one clear message."""
    try:
        client = warden.Approvals(target, token=token, tls=warden.TLS.from_environ(os.environ))
    except (warden.WardenError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    try:
        yield client
    except warden.ApprovalError as exc:
        raise plane_refused(target, exc.status, str(exc)) from None
    finally:
        client.close()


@approvals.command("list")
@TARGET_OPTION
@TOKEN_OPTION
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(STATES),
    help="Only approvals in this state; repeat for several. [default: pending]",
)
@click.option("--all", "every_state", is_flag=True, help="Approvals in every state.")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIST),
    default=100,
    show_default=True,
    help="At most this many, newest first.",
)
@click.option(
    "--watch",
    is_flag=True,
    help="Print the pending approvals, then every event as it happens, until interrupted.",
)
@JSON_OPTION
def approvals_list(
    target: str,
    token: str,
    states: tuple[str, ...],
    every_state: bool,
    limit: int,
    watch: bool,
    as_json: bool,
) -> None:
    """Your tenant's approvals, newest first."""
    with _client(target, token) as client:
        if watch:
            _watch(client, as_json)
            return
        chosen: tuple[Any, ...] = () if every_state else (states or ("pending",))
        found = client.list(states=chosen, limit=limit)
    if not found:
        click.echo(_none_listed(token, chosen), err=True)
    if as_json:
        for approval in found:
            click.echo(approval.model_dump_json())
        return
    _table([_row(a) for a in found])


def _none_listed(token: str, states: tuple[str, ...]) -> str:
    """Why the list is empty: approvals are kept per tenant, and a token
    without one sees only the approvals of calls made without one."""
    which = " or ".join(states) + " " if states else ""
    try:
        tenant = jwt.decode(token, options={"verify_signature": False}).get("tenant")
    except jwt.PyJWTError:
        tenant = None  # the plane accepted it: it is a JWT, but keep quiet if not
    if not tenant:
        return (
            f"no {which}approvals: your token names no tenant, so you see only the "
            "approvals of calls made without one (approvals are kept per tenant; "
            "a token for a tenant carries a tenant claim, e.g. "
            "`warden token mint --tenant acme`)"
        )
    return f"no {which}approvals in tenant {tenant}"


def _watch(client: warden.Approvals, as_json: bool) -> None:
    if not as_json:
        click.echo("  ".join(c.upper() for c in ("event", *_COLUMNS)))
    for event in client.watch(include_pending=True):
        if as_json:
            click.echo(event.model_dump_json())
        else:
            click.echo("  ".join((event.type, *_row(event.approval))))
    raise click.ClickException("the plane closed the watch stream (it is stopping)")


@approvals.command("show")
@click.argument("approval_id")
@TARGET_OPTION
@TOKEN_OPTION
@JSON_OPTION
def approvals_show(approval_id: str, target: str, token: str, as_json: bool) -> None:
    """One approval, with the arguments it would approve."""
    with _client(target, token) as client:
        approval = client.get(approval_id)
    if as_json:
        click.echo(approval.model_dump_json())
        return
    _describe(approval)


@approvals.command("approve")
@click.argument("approval_id")
@TARGET_OPTION
@TOKEN_OPTION
@click.option("--reason", default="", help="Why, for the audit log.")
def approvals_approve(approval_id: str, target: str, token: str, reason: str) -> None:
    """Approve a pending approval: its call may then run once, with exactly its arguments."""
    _decide(target, token, lambda c: c.approve(approval_id, reason=reason))


@approvals.command("deny")
@click.argument("approval_id")
@TARGET_OPTION
@TOKEN_OPTION
@click.option("--reason", required=True, help="Why; the resumed call's APPROVAL_DENIED carries it.")
def approvals_deny(approval_id: str, target: str, token: str, reason: str) -> None:
    """Deny a pending approval, with a reason."""
    _decide(target, token, lambda c: c.deny(approval_id, reason=reason))


def _decide(
    target: str, token: str, decision: Callable[[warden.Approvals], warden.Approval]
) -> None:
    with _client(target, token) as client:
        approval = decision(client)
    click.echo(f"{approval.id} {approval.state} by {approval.decided_by}")


def _row(approval: warden.Approval) -> tuple[str, ...]:
    return (
        approval.id,
        approval.state,
        f"{approval.capability_id} v{approval.capability_version}",
        approval.requester_id,
        _when(approval.expires_at),
        "yes" if approval.may_decide else "no",
        approval.message,
    )


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(_COLUMNS)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(_COLUMNS, widths, strict=True)))
    for row in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _describe(approval: warden.Approval) -> None:
    fields = [
        ("id", approval.id),
        ("state", approval.state),
        ("capability", f"{approval.capability_id} v{approval.capability_version}"),
        ("service", approval.service),
        ("requester", approval.requester_id),
        ("tenant", approval.tenant),
        ("rule", approval.rule_id),
        ("message", approval.message),
        ("created", _when(approval.created_at)),
        ("expires", _when(approval.expires_at)),
        ("decided by", approval.decided_by or ""),
        ("decided", _when(approval.decided_at) if approval.decided_at else ""),
        ("reason", approval.reason or ""),
        ("you may decide", "yes" if approval.may_decide else "no"),
        ("input digest", approval.input_digest),
        ("invocation", approval.invocation_id or ""),
    ]
    for name, value in fields:
        if value:
            click.echo(f"{name + ':':<16}{value}")
    click.echo("input:")
    click.echo(json.dumps(approval.input, indent=2, ensure_ascii=False, sort_keys=True))


def _when(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
