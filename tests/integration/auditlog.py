"""A known audit log: events with chosen times, actors, tenants and outcomes,
written through the real store, and an oracle that filters them in Python."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from warden_server.records.events import AuditEvent
from warden_server.store import SQLiteStore

BASE = datetime(2026, 3, 1, tzinfo=UTC)
STEP = timedelta(minutes=5)

# kind, status, capability, actor, tenant, stage, code, invocation
LOG: list[tuple[str, str, str | None, str | None, str | None, str | None, str | None, str | None]]
LOG = [
    ("registry", "registered", "orders.refund", None, None, None, None, None),
    ("registry", "registered", "billing.charge", None, None, None, None, None),
    ("decision", "granted", "orders.refund", "alice", "acme", None, None, "i-01"),
    ("outcome", "succeeded", "orders.refund", "alice", "acme", None, None, "i-01"),
    ("decision", "failed", "orders.refund", "bob", "acme", "policy", "POLICY_DENIED", "i-02"),
    ("decision", "failed", "orders.get", "carol", "globex", "discovery", "CAPABILITY_NOT_FOUND", "i-03"),  # noqa: E501
    ("decision", "suspended", "orders.refund", "alice", "acme", "approval", "APPROVAL_REQUIRED", "i-04"),  # noqa: E501
    ("approval", "requested", "orders.refund", "alice", "acme", None, None, "i-04"),
    ("decision", "granted", "billing.charge", "carol", "globex", None, None, "i-05"),
    ("outcome", "failed", "billing.charge", "carol", "globex", "output-validation", "OUTPUT_INVALID", "i-05"),  # noqa: E501
    ("decision", "failed", "orders.get", "bob", "acme", "input-validation", "INPUT_INVALID", "i-06"),  # noqa: E501
    ("decision", "rejected", None, None, None, None, None, "i-07"),
    ("decision", "granted", "orders.get", "bob", "acme", None, None, "i-08"),
    ("outcome", "succeeded", "orders.get", "bob", "acme", None, None, "i-08"),
    ("decision", "failed", "billing.charge", "carol", "globex", "policy", "POLICY_DENIED", "i-09"),
    ("decision", "granted", "billing.refund", "dave", "globex", None, None, "i-10"),
    ("outcome", "failed", "billing.refund", "dave", "globex", "execution", "NOT_ELIGIBLE", "i-10"),
    ("decision", "failed", "orders.refund", "alice", "acme", "policy", "POLICY_DENIED", "i-11"),
]  # fmt: skip


def ts(index: int) -> str:
    """The time of the event at ``index`` (0-based), as stored."""
    moment = BASE + index * STEP
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def events() -> list[AuditEvent]:
    return [
        AuditEvent(
            kind=kind,  # type: ignore[arg-type]
            status=status,
            capability_id=capability,
            capability_version="1" if capability else None,
            actor_id=actor,
            tenant=tenant,
            stage=stage,
            code=code,
            invocation_id=invocation,
            input='{"secret":"[redacted]"}' if kind == "decision" else None,
            ts=ts(i),
        )
        for i, (kind, status, capability, actor, tenant, stage, code, invocation) in enumerate(LOG)
    ]


def write(store: SQLiteStore) -> None:
    """Append the log, one transaction per event, as the plane would."""
    for event in events():
        store.transact(lambda tx, e=event: tx.append_audit(e))


def seeded_store(path: Path) -> Path:
    store = SQLiteStore(path)
    try:
        write(store)
    finally:
        store.close()
    return path


def expected_seqs(keep: Callable[[dict[str, Any]], bool]) -> list[int]:
    """Sequence numbers of the events ``keep`` selects, newest first."""
    rows = [
        {
            "seq": i + 1,
            "ts": ts(i),
            "kind": kind,
            "status": status,
            "capability_id": capability,
            "actor_id": actor,
            "tenant": tenant,
            "stage": stage,
            "code": code,
            "invocation_id": invocation,
        }
        for i, (kind, status, capability, actor, tenant, stage, code, invocation) in enumerate(LOG)
    ]
    return [r["seq"] for r in reversed(rows) if keep(r)]


def glob(pattern: str) -> Callable[[dict[str, Any]], bool]:
    return lambda r: (
        r["capability_id"] is not None and fnmatch.fnmatchcase(r["capability_id"], pattern)
    )
