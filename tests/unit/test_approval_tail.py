"""The approval tail: each process hears of every process's approval changes
by reading the audit log, and reads each record once."""

from __future__ import annotations

from pathlib import Path

from tests.unit.approval_records import pending
from warden_server.approvals.events import ApprovalHub
from warden_server.approvals.tail import ApprovalTail
from warden_server.records.events import AuditEvent
from warden_server.store import SQLiteStore, WriteTransaction


def append(store: SQLiteStore, event: AuditEvent) -> int:
    def work(tx: WriteTransaction) -> int:
        return tx.append_audit(event)

    return store.transact(work)


def test_a_poll_reads_only_what_was_committed_since_the_last(tmp_path: Path) -> None:
    """A plane without approvals must not read the whole log written since it
    started at every poll (twenty times a second): each poll starts where the
    last one ended, approval records or not."""
    store = SQLiteStore(tmp_path / "w.db")
    append(store, AuditEvent(kind="policy", status="loaded"))
    hub = ApprovalHub(shared=True, last_seq=store.last_seq)
    tail = ApprovalTail(store, hub)
    statements: list[str] = []
    try:
        assert tail.read_through == 1
        for _ in range(5):
            append(store, AuditEvent(kind="decision", status="granted"))
        assert tail.poll() == 0
        assert tail.read_through == store.last_seq() == 6

        store.transact(lambda tx: tx.insert_approval(pending("a1")))
        append(store, AuditEvent(kind="approval", status="requested", approval_id="a1"))
        append(store, AuditEvent(kind="decision", status="granted"))
        store._reader().set_trace_callback(statements.append)
        assert tail.poll() == 1
        assert tail.read_through == 8
        assert any("seq > 6 AND seq <= 8" in s for s in statements), statements
        assert tail.poll() == 0
    finally:
        store.close()
