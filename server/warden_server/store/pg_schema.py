"""The PostgreSQL store's schema: versioned migrations, applied at open.

``warden_schema`` records how many have run. They run under an advisory lock,
so replicas starting together on an empty database migrate it once: the
others wait, then find it current. The tables and indexes are the SQLite
store's (``migrations.py``) at its newest version, with ``chain_head`` (the
row every batch locks, so replicas extend one chain) and ``store_meta``.
Text compares by code point (``COLLATE "C"``), as in SQLite, so capability
ranges and times order the same in both.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg

from warden_server.records.chain import GENESIS
from warden_server.records.events import COLUMNS
from warden_server.store.base import StoreError
from warden_server.store.replica_sql import create_table as create_replicas_table

MIGRATION_LOCK: Final = 0x57415244454E4D47
"""The advisory lock held while migrating."""

TEXT: Final = 'TEXT COLLATE "C"'
_AUDIT_TYPES: Final = {
    "seq": "BIGINT PRIMARY KEY",
    "exposed": "INTEGER",
    "retryable": "INTEGER",
    "executed_before_failure": "INTEGER",
    "duration_ms": "BIGINT",
    "attempt": "INTEGER",
}
_AUDIT_NOT_NULL: Final = {"event_id", "ts", "kind", "status", "prev_hash", "hash"}


def _audit_table() -> str:
    columns = []
    for column in COLUMNS:
        kind = _AUDIT_TYPES.get(column, TEXT)
        columns.append(f"{column} {kind}" + (" NOT NULL" if column in _AUDIT_NOT_NULL else ""))
    return f"CREATE TABLE audit_events ({', '.join(columns)})"


def _initial() -> list[str]:
    audit_indexes = [
        "CREATE UNIQUE INDEX audit_events_event_id ON audit_events (event_id)",
        "CREATE INDEX audit_events_ts ON audit_events (ts, seq)",
        "CREATE INDEX audit_events_invocation_id ON audit_events (invocation_id)",
        "CREATE INDEX audit_events_call_id ON audit_events (call_id)",
    ] + [
        f"CREATE INDEX audit_events_{column}_ts ON audit_events ({column}, ts, seq)"
        for column in ("capability_id", "actor_id", "tenant", "stage", "code", "status", "kind")
    ]
    return [
        _audit_table(),
        *audit_indexes,
        f"""CREATE TABLE audit_checkpoints (
            seq BIGINT PRIMARY KEY, hash {TEXT} NOT NULL, created_at {TEXT} NOT NULL,
            pruned_before {TEXT} NOT NULL, records BIGINT NOT NULL, key_id {TEXT} NOT NULL,
            signature {TEXT} NOT NULL)""",
        f"""CREATE TABLE capabilities (
            id {TEXT} NOT NULL, version {TEXT} NOT NULL, service {TEXT} NOT NULL,
            digest {TEXT} NOT NULL, definition {TEXT} NOT NULL, registered_at {TEXT} NOT NULL,
            ordinal INTEGER NOT NULL, mac {TEXT}, PRIMARY KEY (id, version))""",
        "CREATE UNIQUE INDEX capabilities_id_ordinal ON capabilities (id, ordinal)",
        f"""CREATE TABLE invocations (
            invocation_id {TEXT} PRIMARY KEY, service {TEXT}, capability_id {TEXT},
            capability_version {TEXT}, actor_id {TEXT}, tenant {TEXT}, surface {TEXT},
            input_digest {TEXT}, state {TEXT}, granted_at {TEXT}, expires_at {TEXT},
            completed_at {TEXT}, call_id {TEXT}, attempt INTEGER, outcome_seq BIGINT,
            outcome_digest {TEXT})""",
        f"""CREATE TABLE approvals (
            approval_id {TEXT} PRIMARY KEY, capability_id {TEXT}, capability_version {TEXT},
            service {TEXT}, requester_id {TEXT}, tenant {TEXT}, input_digest {TEXT},
            input {TEXT}, rule_id {TEXT}, message {TEXT}, approvers {TEXT}, state {TEXT},
            created_at {TEXT}, expires_at {TEXT}, decided_by {TEXT}, reason {TEXT},
            decided_at {TEXT}, invocation_id {TEXT}, policy_revision {TEXT},
            requester {TEXT}, mac {TEXT})""",
        "CREATE INDEX approvals_tenant_state ON approvals (tenant, state)",
        "CREATE INDEX approvals_state_expires_at ON approvals (state, expires_at)",
        "CREATE INDEX approvals_tenant_created_at ON approvals (tenant, created_at)",
        f"""CREATE TABLE idempotency_keys (
            service {TEXT} NOT NULL, capability_id {TEXT} NOT NULL, actor_id {TEXT} NOT NULL,
            key {TEXT} NOT NULL, input_digest {TEXT} NOT NULL, invocation_id {TEXT} NOT NULL,
            state {TEXT} NOT NULL, created_at {TEXT} NOT NULL, expires_at {TEXT} NOT NULL,
            completed_at {TEXT}, status {TEXT}, failure {TEXT},
            executed_before_failure INTEGER, sealed_output BYTEA, mac {TEXT},
            PRIMARY KEY (service, capability_id, actor_id, key))""",
        "CREATE INDEX idempotency_keys_invocation_id ON idempotency_keys (invocation_id)",
        "CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at)",
        f"CREATE TABLE decided_invocations (invocation_id {TEXT} PRIMARY KEY)",
        f"""CREATE TABLE chain_head (
            id INTEGER PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL, hash {TEXT} NOT NULL)""",
        f"INSERT INTO chain_head (id, seq, hash) VALUES (1, 0, '{GENESIS}')",  # noqa: S608
        f"CREATE TABLE store_meta (name {TEXT} PRIMARY KEY, value {TEXT} NOT NULL)",
    ]


def _limits() -> list[str]:
    """The counters of policy limits (as ``migrations._m009_limits``)."""
    return [
        f"""CREATE TABLE limit_buckets (
            limit_id {TEXT} NOT NULL, limit_key {TEXT} NOT NULL,
            full_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (limit_id, limit_key))""",
        f"""CREATE TABLE limit_holds (
            id BIGSERIAL PRIMARY KEY, limit_id {TEXT} NOT NULL, limit_key {TEXT} NOT NULL,
            invocation_id {TEXT} NOT NULL, kind {TEXT} NOT NULL,
            amount DOUBLE PRECISION NOT NULL, at DOUBLE PRECISION NOT NULL,
            until DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX limit_holds_key ON limit_holds (limit_id, limit_key, until)",
        "CREATE INDEX limit_holds_invocation_id ON limit_holds (invocation_id)",
    ]


MIGRATIONS: Final[list[list[str]]] = [
    _initial(),
    [create_replicas_table(TEXT)],  # what each replica serves (warden_server/replicas.py)
    _limits(),
]
"""Each migration's statements; never edited once released."""


def migrate(conn: psycopg.Connection[Any]) -> int:
    """Apply every migration not yet applied, in the caller's transaction,
    under the migration lock; returns the schema version."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
    conn.execute("CREATE TABLE IF NOT EXISTS warden_schema (version INTEGER NOT NULL)")
    row = conn.execute("SELECT max(version) AS version FROM warden_schema").fetchone()
    version = int((row["version"] if isinstance(row, dict) else row[0]) or 0) if row else 0
    if version > len(MIGRATIONS):
        raise StoreError(
            f"its schema version {version} is newer than this Warden's "
            f"({len(MIGRATIONS)}): upgrade Warden"
        )
    for number, statements in enumerate(MIGRATIONS[version:], start=version + 1):
        for statement in statements:
            conn.execute(statement)
        conn.execute("INSERT INTO warden_schema (version) VALUES (%s)", (number,))
    return len(MIGRATIONS)
