"""The store knows which record holds an invocation's outcome, for invocations
completed before it kept that too."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils

from warden_server.records.chain import GENESIS, record_hash
from warden_server.records.events import AuditEvent
from warden_server.store import SQLiteStore
from warden_server.store.migrations import MIGRATIONS, _m007_outcome_reports


def test_outcomes_logged_before_the_migration_are_found(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    db = sqlite_utils.Database(conn)
    before = MIGRATIONS.index(_m007_outcome_reports)
    for migration in MIGRATIONS[:before]:
        migration(db)
    conn.execute(f"PRAGMA user_version = {before}")
    prev = GENESIS
    for seq, kind in ((1, "decision"), (2, "outcome")):
        row = AuditEvent(kind=kind, status="granted", invocation_id="i-1").row(seq, prev)
        row["hash"] = record_hash(row)
        db.table("audit_events").insert(row)
        prev = row["hash"]
    for invocation_id, state in (("i-1", "completed"), ("i-2", "granted")):
        db.table("invocations").insert(
            {"invocation_id": invocation_id, "state": state, "service": "orders"}
        )
    conn.commit()
    conn.close()

    store = SQLiteStore(path)
    try:
        done, running = store.get_invocation("i-1"), store.get_invocation("i-2")
        assert done is not None and (done.outcome_seq, done.outcome_digest) == (2, None)
        assert running is not None and running.outcome_seq is None
    finally:
        store.close()
