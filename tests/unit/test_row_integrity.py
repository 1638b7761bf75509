"""The rows that decide (registry, approvals, idempotency keys) carry a MAC under
a key kept beside the store: a row edited outside the plane is refused and
reported, never used."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from tests.unit.approval_records import CREATED, pending
from warden_server.audit.reader import verify
from warden_server.records.query import RecordFilter
from warden_server.store import CapabilityRecord, IdempotencyRecord, SQLiteStore
from warden_server.store.integrity import IntegrityKeyMissing, TamperedRow, key_path

MIDWAY = "2026-01-01T00:30:00.000Z"


def edit(path: Path, sql: str) -> None:
    """Change the store as someone with a SQLite shell would."""
    conn = sqlite3.connect(path)
    try:
        assert conn.execute(sql).rowcount == 1
        conn.commit()
    finally:
        conn.close()


def integrity_records(store: SQLiteStore) -> list[str]:
    store.transact(lambda tx: None)  # the writer records reports in its next batch
    return [r["reason"] for r in store.audit_records(RecordFilter(kind="integrity"))]


def test_the_integrity_key_is_made_once_beside_the_store_for_its_owner_only(
    tmp_path: Path,
) -> None:
    path = tmp_path / "warden.db"
    SQLiteStore(path).close()
    key = key_path(path)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    made = key.read_text()
    SQLiteStore(path).close()
    assert key.read_text() == made


def test_a_tampered_approval_is_refused_and_reported_never_used(tmp_path: Path) -> None:
    path = tmp_path / "warden.db"
    store = SQLiteStore(path)
    store.transact(lambda tx: tx.insert_approval(pending("a1")))
    store.transact(lambda tx: tx.insert_approval(pending("a2")))
    assert store.get_approval("a1") is not None
    edit(path, "UPDATE approvals SET state = 'approved' WHERE approval_id = 'a1'")
    with pytest.raises(TamperedRow, match="approvals row a1 fails its integrity check"):
        store.get_approval("a1")
    with pytest.raises(TamperedRow):
        store.transact(lambda tx: tx.consume_approval("a1", MIDWAY))
    assert [a.approval_id for a in store.list_approvals("acme")] == ["a2"]
    assert store.transact(lambda tx: tx.decide_approval("a2", "approved", "boss", None, MIDWAY))
    assert store.get_approval("a2").state == "approved"  # type: ignore[union-attr]
    assert integrity_records(store) == ["approvals row a1 fails its integrity check: "
                                        "it was changed outside the plane"]  # fmt: skip
    result = verify(store)
    assert not result.ok and result.first_bad_seq is None
    assert result.problem and "approvals row a1" in result.problem
    store.close()


def test_a_tampered_idempotency_key_is_refused_and_reported_never_replayed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "warden.db"
    store = SQLiteStore(path)
    reservation = IdempotencyRecord(
        service="orders",
        capability_id="orders.refund",
        actor_id="bot-7",
        key="k1",
        input_digest="sha256:0",
        invocation_id="inv-1",
        state="in_progress",
        created_at=CREATED,
        expires_at="2999-01-01T00:00:00.000Z",
    )
    assert store.transact(lambda tx: tx.reserve_idempotency(reservation, CREATED))
    store.transact(
        lambda tx: tx.settle_idempotency(
            "inv-1",
            MIDWAY,
            status="failed",
            failure='{"code":"NOT_ELIGIBLE"}',
            executed_before_failure=True,
            sealed_output=None,
        )
    )
    assert store.idempotency_of("inv-1").status == "failed"  # type: ignore[union-attr]
    edit(path, "UPDATE idempotency_keys SET status = 'succeeded' WHERE invocation_id = 'inv-1'")
    with pytest.raises(TamperedRow, match="held by invocation inv-1"):
        store.get_idempotency("orders", "orders.refund", "bot-7", "k1")
    assert len(integrity_records(store)) == 1
    store.close()


def test_a_store_whose_integrity_key_went_missing_does_not_open(tmp_path: Path) -> None:
    path = tmp_path / "warden.db"
    store = SQLiteStore(path)
    store.transact(lambda tx: tx.insert_approval(pending("a1")))
    store.close()
    key_path(path).unlink()
    with pytest.raises(IntegrityKeyMissing, match="restore it beside the store"):
        SQLiteStore(path)


def test_a_tampered_older_version_is_left_out_of_every_version_and_reported(
    tmp_path: Path,
) -> None:
    """A policy load reads every version of every capability to check its
    rules; an edited row among them is reported and left out, as it is never
    served, and the versions around it are still read."""
    path = tmp_path / "warden.db"
    store = SQLiteStore(path)
    for version in ("1", "2"):
        record = CapabilityRecord(
            id="orders.pay",
            version=version,
            service="orders",
            digest=f"sha256:{version}",
            definition={"id": "orders.pay", "version": version},
            registered_at=CREATED,
        )
        store.transact(lambda tx, r=record: tx.insert_capability(r))
    edit(path, "UPDATE capabilities SET service = 'billing' WHERE version = '1'")
    assert [(c.id, c.version) for c in store.every_capability_version()] == [("orders.pay", "2")]
    assert integrity_records(store) == ["capabilities row orders.pay@1 fails its integrity "
                                        "check: it was changed outside the plane"]  # fmt: skip
    store.close()
