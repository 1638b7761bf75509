"""``warden limits status``: the current usage of the policy limits in force,
through the plane's audit API, as an auditor of every tenant."""

from __future__ import annotations

import json
from dataclasses import asdict

import click
import grpc

from warden.shared.tls import sync_channel
from warden.shared.wire import ACTOR_TOKEN_METADATA, BEARER
from warden.v1 import audit_pb2, audit_pb2_grpc
from warden_server.cli.common import TARGET_OPTION, required_token, rpc_refused, tls_credentials
from warden_server.limits import LimitStatus
from warden_server.services import convert


@click.group()
def limits() -> None:
    """Rate limits, budgets and concurrency caps of the policies in force."""


@limits.command("status")
@TARGET_OPTION
@click.option(
    "--token",
    envvar="WARDEN_TOKEN",
    callback=required_token,
    help="A JWT with the role auditor:all (or set WARDEN_TOKEN).",
)
@click.option("--limit", "limit_id", default="", help="Only this limit (by id).")
@click.option("--key", default=None, help="Only this key's usage (e.g. a tenant).")
@click.option("--json", "as_json", is_flag=True, help="JSON, one limit per line.")
def limits_status(target: str, token: str, limit_id: str, key: str | None, as_json: bool) -> None:
    """How much of each limit its keys use now, and when usage next falls."""
    request = audit_pb2.LimitUsageRequest(limit_id=limit_id)
    if key is not None:
        request.key = key
    channel = sync_channel(target, tls_credentials())
    try:
        response = audit_pb2_grpc.AuditStub(channel).LimitUsage(
            request, metadata=((ACTOR_TOKEN_METADATA, f"{BEARER} {token}"),), timeout=30
        )
    except grpc.RpcError as exc:
        raise rpc_refused(target, exc) from None
    finally:
        channel.close()
    report = convert.limit_usage_from_proto(response)
    if as_json:
        for status in report:
            click.echo(json.dumps(asdict(status), sort_keys=True))
        return
    if not report:
        click.echo("No limits in force.")
    for status in report:
        _print(status, key)


def _print(status: LimitStatus, key: str | None) -> None:
    mode = "" if status.mode == "enforce" else f" ({status.mode} mode)"
    click.echo(f"{status.limit_id}: {_shape(status)}{mode}  [{status.file}:{status.line}]")
    if not status.keys:
        click.echo("  no usage" if key is None else f"  {key!r}: no usage")
    for usage in status.keys:
        shown = usage.key or "(every call)"
        release = f", next release in {usage.next_release_ms} ms" if usage.next_release_ms else ""
        click.echo(f"  {shown}: {_amount(usage.used)} of {_amount(status.capacity)}{release}")


def _shape(status: LimitStatus) -> str:
    if status.kind == "rate":
        every = _amount(status.period_seconds)
        return f"rate, a token every {every}s, burst {_amount(status.capacity)}"
    if status.kind == "budget":
        return f"budget {_amount(status.capacity)} per {_amount(status.period_seconds)}s"
    return f"concurrency {_amount(status.capacity)}"


def _amount(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"
