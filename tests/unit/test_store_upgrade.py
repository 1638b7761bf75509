"""The store's schema grows without breaking the audit chain written before."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils

from warden_server.audit.reader import verify
from warden_server.records.chain import GENESIS, record_hash
from warden_server.records.events import AuditEvent
from warden_server.store import SQLiteStore
from warden_server.store.migrations import MIGRATIONS


def write_first_release_store(path: Path) -> None:
    """A store as the first schema left it: two records, hashed without the
    columns later migrations added."""
    conn = sqlite3.connect(path)
    db = sqlite_utils.Database(conn)
    MIGRATIONS[0](db)
    conn.execute("PRAGMA user_version = 1")
    prev = GENESIS
    for seq in (1, 2):
        row = AuditEvent(kind="decision", status="granted", invocation_id=f"i{seq}").row(seq, prev)
        del row["call_id"], row["attempt"]
        row["hash"] = record_hash(row)
        conn.execute(
            f"INSERT INTO audit_events ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
            list(row.values()),
        )
        prev = row["hash"]
    conn.commit()
    conn.close()


def test_records_from_before_a_migration_still_verify(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write_first_release_store(path)
    store = SQLiteStore(path)
    try:
        event = AuditEvent(kind="decision", status="granted", call_id="c-1", attempt=2)
        store.transact(lambda tx: tx.append_audit(event))
        result = verify(store)
        assert result.ok and result.checked == 3
        rows = list(store.audit_records())
        assert [(r["call_id"], r["attempt"]) for r in rows] == [
            (None, None),
            (None, None),
            ("c-1", 2),
        ]
    finally:
        store.close()


def test_setting_or_clearing_a_late_column_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write_first_release_store(path)
    store = SQLiteStore(path)
    try:
        event = AuditEvent(kind="decision", status="granted", call_id="c-1", attempt=1)
        store.transact(lambda tx: tx.append_audit(event))
    finally:
        store.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE audit_events SET call_id = 'forged' WHERE seq = 1")
    conn.execute("UPDATE audit_events SET attempt = NULL WHERE seq = 3")
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    try:
        result = verify(store)
    finally:
        store.close()
    assert not result.ok and result.first_bad_seq == 1


def test_ids_decided_before_the_upgrade_stay_spent(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write_first_release_store(path)
    store = SQLiteStore(path)
    try:
        claimed = store.transact(lambda tx: [tx.claim_invocation(i) for i in ("i1", "i2", "i3")])
        assert claimed == [False, False, True]
    finally:
        store.close()


def test_a_fresh_store_is_exactly_what_every_migration_builds(tmp_path: Path) -> None:
    """A new store is copied from one migrated once per process; it must be
    the store that running each migration on the new file would give."""
    stepped = tmp_path / "stepped.db"
    conn = sqlite3.connect(stepped)
    db = sqlite_utils.Database(conn)
    for number, migration in enumerate(MIGRATIONS, start=1):
        migration(db)
        conn.execute(f"PRAGMA user_version = {number}")
        conn.commit()
    conn.close()
    for name in ("first.db", "second.db"):  # the second copy comes from the same original
        SQLiteStore(tmp_path / name).close()

    def described(path: Path) -> tuple[object, ...]:
        seen = sqlite3.connect(path)
        try:
            return (
                sorted(seen.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")),
                sorted(seen.execute("SELECT * FROM sqlite_stat1")),
                seen.execute("PRAGMA user_version").fetchone(),
            )
        finally:
            seen.close()

    stepped_schema, stepped_stats, stepped_version = described(stepped)
    assert stepped_version == (len(MIGRATIONS),)
    for name in ("first.db", "second.db"):
        schema, stats, version = described(tmp_path / name)
        assert (schema, stats, version) == (stepped_schema, stepped_stats, stepped_version)
        with sqlite3.connect(tmp_path / name) as fresh:
            assert fresh.execute("PRAGMA journal_mode").fetchone() == ("wal",)
