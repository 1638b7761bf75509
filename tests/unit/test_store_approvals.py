"""The store's approval transitions: each moves an approval at most once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils

from tests.unit.approval_records import pending
from warden_server.store import SQLiteStore
from warden_server.store.migrations import MIGRATIONS

BEFORE = "2026-01-01T00:30:00.000Z"
AFTER = "2026-01-01T01:00:00.000Z"


def test_transitions_happen_once_and_never_after_expiry(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "w.db")
    try:
        store.transact(lambda tx: tx.insert_approval(pending()))
        assert not store.transact(lambda tx: tx.consume_approval("a1", BEFORE))
        assert not store.transact(lambda tx: tx.decide_approval("a1", "approved", "m", None, AFTER))
        assert store.transact(lambda tx: tx.decide_approval("a1", "approved", "m", None, BEFORE))
        assert not store.transact(lambda tx: tx.decide_approval("a1", "denied", "n", "x", BEFORE))
        assert not store.transact(lambda tx: tx.consume_approval("a1", AFTER))
        assert not store.transact(lambda tx: tx.expire_approval("a1", BEFORE))
        assert [a.approval_id for a in store.transact(lambda tx: tx.due_approvals(AFTER, 10))] == [
            "a1"
        ]
        assert store.transact(lambda tx: tx.consume_approval("a1", BEFORE))
        assert not store.transact(lambda tx: tx.consume_approval("a1", BEFORE))
        assert not store.transact(lambda tx: tx.expire_approval("a1", AFTER))
        assert store.transact(lambda tx: tx.due_approvals(AFTER, 10)) == []
        record = store.get_approval("a1")
        assert record is not None
        assert (record.state, record.decided_by) == ("consumed", "m")
    finally:
        store.close()


def test_listing_is_per_tenant_newest_first(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "w.db")
    try:
        store.transact(lambda tx: tx.insert_approval(pending("old")))
        store.transact(lambda tx: tx.insert_approval(pending("new", created_at=BEFORE)))
        store.transact(lambda tx: tx.insert_approval(pending("other", tenant="globex")))
        assert [a.approval_id for a in store.list_approvals("acme")] == ["new", "old"]
        assert [a.approval_id for a in store.list_approvals("acme", ["approved"])] == []
        assert [a.approval_id for a in store.list_approvals("acme", limit=1)] == ["new"]
    finally:
        store.close()


def test_a_store_from_before_approvals_gains_their_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    MIGRATIONS[0](sqlite_utils.Database(conn))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    SQLiteStore(path).close()
    columns = set(sqlite_utils.Database(path)["approvals"].columns_dict)
    assert {"invocation_id", "policy_revision", "requester"} <= columns
