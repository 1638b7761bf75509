"""Schema migrations for the SQLite store, applied in order at open.

``PRAGMA user_version`` records how many have run; each migration is a
function over a ``sqlite_utils.Database`` and is never edited once released.
A fresh store is a copy of one every migration was run on once per process
(in memory), not a run of them all again: the migrations stay the one
source of truth, and a new store takes a few milliseconds instead of thirty.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
from collections.abc import Callable

import sqlite_utils

from warden_server.store.base import StoreError
from warden_server.store.notifications import create_tables
from warden_server.store.replica_sql import create_table as create_replicas_table


def _m001_initial(db: sqlite_utils.Database) -> None:
    db.table("audit_events").create(
        {
            "seq": int,
            "event_id": str,
            "ts": str,
            "kind": str,
            "invocation_id": str,
            "capability_id": str,
            "capability_version": str,
            "service": str,
            "actor_id": str,
            "tenant": str,
            "surface": str,
            "status": str,
            "stage": str,
            "code": str,
            "exposed": int,
            "retryable": int,
            "public_message": str,
            "executed_before_failure": int,
            "policy_revision": str,
            "rules": str,
            "approval_id": str,
            "input_digest": str,
            "input": str,
            "output": str,
            "cause_type": str,
            "cause_message": str,
            "stack": str,
            "duration_ms": int,
            "trace_id": str,
            "reason": str,
            "details": str,
            "prev_hash": str,
            "hash": str,
        },
        pk="seq",
        not_null={"event_id", "ts", "kind", "status", "prev_hash", "hash"},
    )
    table = db.table("audit_events")
    table.create_index(["event_id"], unique=True)
    table.create_index(["ts"])
    table.create_index(["invocation_id"])
    table.create_index(["capability_id", "ts"])
    table.create_index(["actor_id", "ts"])
    table.create_index(["tenant", "ts"])
    table.create_index(["stage", "ts"])
    table.create_index(["code", "ts"])

    db.table("capabilities").create(
        {
            "id": str,
            "version": str,
            "service": str,
            "digest": str,
            "definition": str,
            "registered_at": str,
            "ordinal": int,
        },
        pk=("id", "version"),
        not_null={"service", "digest", "definition", "registered_at", "ordinal"},
    )
    db.table("capabilities").create_index(["id", "ordinal"], unique=True)

    db.table("invocations").create(
        {
            "invocation_id": str,
            "service": str,
            "capability_id": str,
            "capability_version": str,
            "actor_id": str,
            "tenant": str,
            "surface": str,
            "input_digest": str,
            "state": str,
            "granted_at": str,
            "expires_at": str,
            "completed_at": str,
        },
        pk="invocation_id",
    )

    db.table("approvals").create(
        {
            "approval_id": str,
            "capability_id": str,
            "capability_version": str,
            "service": str,
            "requester_id": str,
            "tenant": str,
            "input_digest": str,
            "input": str,
            "rule_id": str,
            "message": str,
            "approvers": str,
            "state": str,
            "created_at": str,
            "expires_at": str,
            "decided_by": str,
            "reason": str,
            "decided_at": str,
        },
        pk="approval_id",
    )
    db.table("approvals").create_index(["tenant", "state"])


def _m002_approvals(db: sqlite_utils.Database) -> None:
    """What deciding and expiring approvals need: the invocation and policy
    revision that asked, the requester's claims for the approvers condition,
    and an index for finding the approvals that are due to expire."""
    table = db.table("approvals")
    table.add_column("invocation_id", str)
    table.add_column("policy_revision", str)
    table.add_column("requester", str)
    table.create_index(["state", "expires_at"])
    table.create_index(["tenant", "created_at"])


def _m003_idempotency(db: sqlite_utils.Database) -> None:
    db.table("idempotency_keys").create(
        {
            "service": str,
            "capability_id": str,
            "actor_id": str,
            "key": str,
            "input_digest": str,
            "invocation_id": str,
            "state": str,
            "created_at": str,
            "expires_at": str,
            "completed_at": str,
            "status": str,
            "failure": str,
            "executed_before_failure": int,
            "sealed_output": bytes,
        },
        pk=("service", "capability_id", "actor_id", "key"),
        not_null={"input_digest", "invocation_id", "state", "created_at", "expires_at"},
    )
    keys = db.table("idempotency_keys")
    keys.create_index(["invocation_id"])
    keys.create_index(["expires_at"])
    # Every attempt of one logical call (automatic retries, SI-11) shares a call id.
    db.table("audit_events").add_column("call_id", str)
    db.table("audit_events").add_column("attempt", int)
    db.table("audit_events").create_index(["call_id"])
    db.table("invocations").add_column("call_id", str)
    db.table("invocations").add_column("attempt", int)


def _m004_audit(db: sqlite_utils.Database) -> None:
    """Indexes for the remaining audit filters, and retention checkpoints.

    Every filter column is indexed together with ``ts``; SQLite appends the
    rowid (``seq``) to each index, so "newest first" (``ts DESC, seq DESC``)
    reads an index backwards and stops at the page size.
    """
    table = db.table("audit_events")
    table.create_index(["status", "ts"])
    table.create_index(["kind", "ts"])
    _plan_for_a_large_log(db)
    db.table("audit_checkpoints").create(
        {
            "seq": int,
            "hash": str,
            "created_at": str,
            "pruned_before": str,
            "records": int,
            "key_id": str,
            "signature": str,
        },
        pk="seq",
        not_null={"hash", "created_at", "pruned_before", "records", "key_id", "signature"},
    )


PLANNER_STATISTICS: dict[str, str] = {
    "idx_audit_events_event_id": "1000000 1",
    "idx_audit_events_invocation_id": "1000000 2",
    "idx_audit_events_call_id": "1000000 2",
    "idx_audit_events_ts": "1000000 1",
    "idx_audit_events_actor_id_ts": "1000000 100 1",
    "idx_audit_events_capability_id_ts": "1000000 2000 1",
    "idx_audit_events_tenant_ts": "1000000 10000 1",
    "idx_audit_events_code_ts": "1000000 50000 1",
    "idx_audit_events_stage_ts": "1000000 100000 1",
    "idx_audit_events_status_ts": "1000000 100000 1",
    "idx_audit_events_kind_ts": "1000000 200000 1",
}
"""``sqlite_stat1`` rows describing the audit log's shape at a million records:
ids are unique, an actor has about a hundred records, a stage or a status
covers a tenth of the log. With them SQLite plans for the log it will be
(skip-scanning the few stages for ``stats --since``, reading an actor's index
newest first) from the first record on, without running ANALYZE over a large
table, which would stall the writer for seconds. A real ANALYZE replaces them."""


def _plan_for_a_large_log(db: sqlite_utils.Database) -> None:
    conn = db.conn
    conn.execute("ANALYZE sqlite_schema")  # creates sqlite_stat1 without reading the log
    conn.execute("DELETE FROM sqlite_stat1 WHERE tbl = 'audit_events'")
    conn.executemany(
        "INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES ('audit_events', ?, ?)",
        PLANNER_STATISTICS.items(),
    )
    conn.execute("ANALYZE sqlite_schema")  # load them into this connection


def _m005_decided_invocations(db: sqlite_utils.Database) -> None:
    """One row per invocation id a decision was recorded for: the store, not a
    read before the write, makes an id good for one decision, whichever
    process or thread decides it. Filled from the decisions already logged."""
    db.execute("CREATE TABLE decided_invocations (invocation_id TEXT PRIMARY KEY) WITHOUT ROWID")
    db.execute(
        "INSERT OR IGNORE INTO decided_invocations SELECT DISTINCT invocation_id "
        "FROM audit_events WHERE kind = 'decision' AND invocation_id IS NOT NULL"
    )


def _m006_row_macs(db: sqlite_utils.Database) -> None:
    """A MAC on every row of the tables that decide (see ``store/integrity.py``).
    The rows already there are sealed by the store right after this migration,
    once, with the store's integrity key."""
    for table in ("capabilities", "approvals", "idempotency_keys"):
        db.table(table).add_column("mac", str)


def _m007_outcome_reports(db: sqlite_utils.Database) -> None:
    """Which record holds each invocation's outcome, and a digest of the report
    that made it: a report repeated after it was taken (its answer lost on the
    way back) is answered with that record instead of a second one. Filled for
    the outcomes already logged; their digests are unknown."""
    table = db.table("invocations")
    table.add_column("outcome_seq", int)
    table.add_column("outcome_digest", str)
    db.execute(
        "UPDATE invocations SET outcome_seq = (SELECT max(seq) FROM audit_events a "
        "WHERE a.invocation_id = invocations.invocation_id AND a.kind = 'outcome') "
        "WHERE state = 'completed'"
    )


def _m008_notifications(db: sqlite_utils.Database) -> None:
    """The durable queue of approval notifications (``store/notifications.py``)."""
    create_tables(db)


def _m009_replicas(db: sqlite_utils.Database) -> None:
    """What each replica of the plane serves (``warden_server/replicas.py``)."""
    db.execute(create_replicas_table())


def _m010_limits(db: sqlite_utils.Database) -> None:
    """The counters of policy limits: each rate limit's token bucket per key
    (when it is full again), and what granted calls hold of budgets and
    concurrency caps (see ``limits.py``)."""
    db.execute(
        "CREATE TABLE limit_buckets (limit_id TEXT NOT NULL, limit_key TEXT NOT NULL, "
        "full_at REAL NOT NULL, PRIMARY KEY (limit_id, limit_key))"
    )
    db.execute(
        "CREATE TABLE limit_holds (limit_id TEXT NOT NULL, limit_key TEXT NOT NULL, "
        "invocation_id TEXT NOT NULL, kind TEXT NOT NULL, amount REAL NOT NULL, "
        "at REAL NOT NULL, until REAL NOT NULL)"
    )
    db.execute("CREATE INDEX limit_holds_key ON limit_holds (limit_id, limit_key, until)")
    db.execute("CREATE INDEX limit_holds_invocation_id ON limit_holds (invocation_id)")


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    _m001_initial,
    _m002_approvals,
    _m003_idempotency,
    _m004_audit,
    _m005_decided_invocations,
    _m006_row_macs,
    _m007_outcome_reports,
    _m008_notifications,
    _m009_replicas,
    _m010_limits,
]

ROW_MACS_SINCE = MIGRATIONS.index(_m006_row_macs) + 1
"""The schema version from which rows carry MACs: a store opened below it has
its rows sealed once, right after migrating."""


def migrate(conn: sqlite3.Connection) -> int:
    """Apply every migration not yet applied; returns the schema version."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > len(MIGRATIONS):
        raise StoreError(
            f"its schema version {version} is newer than this Warden's "
            f"({len(MIGRATIONS)}): upgrade Warden"
        )
    if version == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
        with _fresh_lock:
            _fresh().backup(conn)  # one transaction: the schema and its version
        return len(MIGRATIONS)
    _apply(conn, version)
    return len(MIGRATIONS)


def _apply(conn: sqlite3.Connection, version: int) -> None:
    db = sqlite_utils.Database(conn)
    for number, migration in enumerate(MIGRATIONS[version:], start=version + 1):
        with conn:
            migration(db)
            conn.execute(f"PRAGMA user_version = {number}")


_fresh_lock = threading.Lock()


@functools.cache
def _fresh() -> sqlite3.Connection:
    """An empty store every migration has run on, in memory (used under ``_fresh_lock``)."""
    fresh = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    _apply(fresh, 0)
    return fresh
