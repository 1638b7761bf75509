"""The store contract: what every store (SQLite and PostgreSQL) does the same.

Each test runs against both. ``open_store`` opens another store over the same
data (another process of the plane on the SQLite file, another replica on the
database), so that what holds across planes is tested too.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.unit.approval_records import CREATED, EXPIRES, pending
from warden_server.audit.checkpoint import CheckpointSigner
from warden_server.audit.reader import AuditFilter, query, stats, verify
from warden_server.audit.retention import prune
from warden_server.errors import Conflict
from warden_server.limits import admit, give_back
from warden_server.policy.engine import CompiledLimit, LimitCall
from warden_server.policy.loader import PolicySource, compile_policies
from warden_server.records.events import AuditEvent
from warden_server.records.query import PageRequest, RecordFilter
from warden_server.store import (
    CapabilityRecord,
    IdempotencyRecord,
    InvocationRecord,
    Store,
    StoreError,
    WriteTransaction,
    open_store,
)
from warden_server.store.integrity import TamperedRow
from warden_server.store.records import ReplicaRecord

LATER = "2026-01-01T00:30:00.000Z"
Opener = Callable[[], Any]


@pytest.fixture(params=["sqlite", "postgresql"])
def open_another(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens a store over the test's one set of data (closed after the test)."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    opened: list[Any] = []

    def opener() -> Any:
        store = open_store(url, tmp_path / "warden.db")
        opened.append(store)
        return store

    yield opener
    for store in opened:
        store.close()


@pytest.fixture
def store(open_another: Opener) -> Any:
    return open_another()


def decision(n: int, **fields: Any) -> AuditEvent:
    values: dict[str, Any] = {
        "kind": "decision",
        "status": "granted",
        "capability_id": f"orders.item{n % 3}",
        "tenant": "acme" if n % 2 else "globex",
        "actor_id": f"bot-{n % 4}",
        "invocation_id": f"inv-{n}",
        "ts": f"2026-01-01T00:00:{n:02d}.000Z",
    }
    values.update(fields)
    return AuditEvent(**values)


def append(store: Store, *events: AuditEvent) -> list[int]:
    return store.transact(lambda tx: [tx.append_audit(e) for e in events])


def test_records_chain_and_verify_across_planes_on_one_store(open_another: Opener) -> None:
    first, second = open_another(), open_another()
    for n in range(10):
        append(first if n % 2 else second, decision(n))
    assert [r["seq"] for r in first.audit_records()] == list(range(1, 11))
    result = verify(second)
    assert result.ok and result.checked == 10


def test_concurrent_requests_on_two_planes_extend_one_chain(open_another: Opener) -> None:
    planes = [open_another(), open_another()]

    def write(plane: Store, start: int) -> None:
        for n in range(start, start + 25):
            append(plane, decision(n))

    threads = [threading.Thread(target=write, args=(planes[i % 2], i * 25)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert planes[0].last_seq() == 100
    assert verify(planes[1]).ok


def test_work_that_raises_is_undone_alone(store: Store) -> None:
    def fails(tx: WriteTransaction) -> None:
        tx.append_audit(decision(1))
        raise ValueError("no")

    with pytest.raises(ValueError):
        store.transact(fails)
    append(store, decision(2))
    assert [r["invocation_id"] for r in store.audit_records()] == ["inv-2"]
    assert verify(store).ok


def test_transact_each_commits_the_works_together_and_a_failure_is_undone_alone(
    store: Store,
) -> None:
    def fails(tx: WriteTransaction) -> int:
        tx.append_audit(decision(2))
        raise ValueError("no")

    def appends(n: int) -> Callable[[WriteTransaction], int]:
        return lambda tx: tx.append_audit(decision(n))

    before = store.batches_committed  # type: ignore[attr-defined]
    results = store.transact_each([appends(1), fails, appends(3)])
    assert store.batches_committed == before + 1  # type: ignore[attr-defined]
    assert results[0] == 1 and results[2] == 2, "the failed one left no gap"
    assert isinstance(results[1], ValueError)
    assert [r["invocation_id"] for r in store.audit_records()] == ["inv-1", "inv-3"]
    assert verify(store).ok


def test_batches_after_a_failure_commit_as_before(store: Store) -> None:
    """A failure makes the next batch take savepoints; the one after goes
    back to running without them. Results and the chain are the same."""

    def fails(tx: WriteTransaction) -> int:
        tx.append_audit(decision(9))
        raise ValueError("no")

    def appends(n: int) -> Callable[[WriteTransaction], int]:
        return lambda tx: tx.append_audit(decision(n))

    assert store.transact(appends(1)) == 1
    for _ in range(2):
        with pytest.raises(ValueError):
            store.transact(fails)
    assert store.transact(appends(3)) == 2
    assert store.transact(appends(4)) == 3
    assert [r["invocation_id"] for r in store.audit_records()] == ["inv-1", "inv-3", "inv-4"]
    assert verify(store).ok


def test_transact_each_past_its_deadline_runs_none(store: Store) -> None:
    results = store.transact_each([lambda tx: tx.append_audit(decision(1))] * 2, deadline=0.0)
    assert [type(r) for r in results] == [StoreError, StoreError]
    assert store.transact_each([]) == []
    assert store.last_seq() == 0


def test_work_past_its_deadline_never_runs(store: Store) -> None:
    with pytest.raises(StoreError, match="deadline"):
        store.transact(lambda tx: tx.append_audit(decision(1)), deadline=0.0)
    assert store.last_seq() == 0


def test_an_invocation_id_is_claimed_once_across_planes(open_another: Opener) -> None:
    first, second = open_another(), open_another()
    assert first.transact(lambda tx: tx.claim_invocation("inv-1")) is True
    assert second.transact(lambda tx: tx.claim_invocation("inv-1")) is False


def invocation(invocation_id: str = "inv-1") -> InvocationRecord:
    return InvocationRecord(
        invocation_id=invocation_id,
        service="orders",
        capability_id="orders.refund",
        capability_version="1",
        actor_id="bot-7",
        tenant="acme",
        surface="sdk",
        input_digest="sha256:0",
        state="granted",
        granted_at=CREATED,
        expires_at=EXPIRES,
    )


def test_an_invocation_is_granted_once_and_completed_once(store: Store) -> None:
    store.transact(lambda tx: tx.insert_invocation(invocation()))
    with pytest.raises(Conflict):
        store.transact(lambda tx: tx.insert_invocation(invocation()))

    def complete(tx: WriteTransaction) -> bool:
        return tx.complete_invocation("inv-1", LATER, outcome_seq=7, report_digest="d")

    assert store.transact(complete) is True
    assert store.transact(complete) is False
    found = store.get_invocation("inv-1")
    assert found is not None
    assert (found.state, found.outcome_seq, found.outcome_digest) == ("completed", 7, "d")


def test_an_approval_is_decided_once_and_consumed_once(open_another: Opener) -> None:
    first, second = open_another(), open_another()
    first.transact(lambda tx: tx.insert_approval(pending()))
    decide = "approved", "alice", "ok", LATER
    assert second.transact(lambda tx: tx.decide_approval("a1", *decide)) is True
    assert (
        first.transact(lambda tx: tx.decide_approval("a1", "denied", "bob", None, LATER)) is False
    )
    assert first.transact(lambda tx: tx.consume_approval("a1", LATER)) is True
    assert second.transact(lambda tx: tx.consume_approval("a1", LATER)) is False
    found = second.get_approval("a1")
    assert found is not None and (found.state, found.decided_by) == ("consumed", "alice")
    assert [a.approval_id for a in first.list_approvals("acme", ["consumed"])] == ["a1"]


def test_due_approvals_expire_once(store: Store) -> None:
    store.transact(lambda tx: tx.insert_approval(pending()))
    after = "2026-01-01T02:00:00.000Z"
    assert [a.approval_id for a in store.transact(lambda tx: tx.due_approvals(after, 10))] == ["a1"]
    assert store.transact(lambda tx: tx.expire_approval("a1", after)) is True
    assert store.transact(lambda tx: tx.expire_approval("a1", after)) is False


def key(invocation_id: str, expires_at: str = EXPIRES) -> IdempotencyRecord:
    return IdempotencyRecord(
        service="orders",
        capability_id="orders.pay",
        actor_id="bot-7",
        key="k-1",
        input_digest="sha256:0",
        invocation_id=invocation_id,
        state="in_progress",
        created_at=CREATED,
        expires_at=expires_at,
    )


def test_an_idempotency_key_is_reserved_once_across_planes(open_another: Opener) -> None:
    first, second = open_another(), open_another()
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def reserve(plane: Store, n: int) -> None:
        barrier.wait()
        results.append(plane.transact(lambda tx: tx.reserve_idempotency(key(f"i{n}"), LATER)))

    threads = [
        threading.Thread(target=reserve, args=(p, n)) for n, p in enumerate([first, second] * 4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 7 + [True]


def test_an_idempotency_key_settles_with_its_outcome_and_releases(store: Store) -> None:
    assert store.transact(lambda tx: tx.reserve_idempotency(key("i1"), LATER))
    store.transact(
        lambda tx: tx.settle_idempotency(
            "i1",
            LATER,
            status="failed",
            failure='{"code": "X"}',
            executed_before_failure=True,
            sealed_output=b"\x00sealed",
        )
    )
    found = store.get_idempotency("orders", "orders.pay", "bot-7", "k-1")
    assert found is not None
    assert (found.state, found.executed_before_failure, found.sealed_output) == (
        "completed",
        True,
        b"\x00sealed",
    )
    assert store.transact(lambda tx: tx.reserve_idempotency(key("i2"), LATER)) is False
    store.transact(lambda tx: tx.reserve_idempotency(key("i3", LATER), CREATED))
    expired_later = "2026-01-01T03:00:00.000Z"
    assert store.transact(lambda tx: tx.reserve_idempotency(key("i4"), expired_later)) is True
    store.transact(lambda tx: tx.release_idempotency("i4"))
    assert store.idempotency_of("i4") is None


def capability(capability_id: str, version: str) -> CapabilityRecord:
    return CapabilityRecord(
        id=capability_id,
        version=version,
        service="orders",
        digest=f"sha256:{version}",
        definition={"id": capability_id, "version": version},
        registered_at=CREATED,
    )


def test_the_registry_keeps_versions_in_order_by_namespace(store: Store) -> None:
    for record in [
        capability("orders.refund", "1"),
        capability("orders.refund", "2"),
        capability("orders.pay", "1"),
        capability("ordersx.pay", "1"),
    ]:
        store.transact(lambda tx, r=record: tx.insert_capability(r))
    assert store.latest_version("orders.refund") == "2"
    latest = store.latest_capabilities(["orders"])
    assert [(c.id, c.version) for c in latest] == [("orders.pay", "1"), ("orders.refund", "2")]
    assert store.latest_capabilities([]) == []
    assert [(c.id, c.version) for c in store.every_capability_version()] == [
        ("orders.pay", "1"),
        ("orders.refund", "1"),
        ("orders.refund", "2"),
        ("ordersx.pay", "1"),
    ]
    count, size = store.transact(lambda tx: tx.registry_size(["orders"]))
    assert count == 2 and size > 0
    found = store.get_capability("orders.refund", "1")
    assert found is not None and found.definition == {"id": "orders.refund", "version": "1"}


def test_audit_queries_filter_by_type_scope_and_page(store: Store) -> None:
    append(store, *(decision(n) for n in range(12)))
    page = store.audit_page(
        RecordFilter(capabilities=("orders.item[01]",)), frozenset({"acme"}), PageRequest(3)
    )
    assert [r["seq"] for r in page.rows] == [10, 8, 4]
    following = store.audit_page(
        RecordFilter(capabilities=("orders.item[01]",)),
        frozenset({"acme"}),
        PageRequest(3, page.next_before),
    )
    assert [r["seq"] for r in following.rows] == [2] and following.next_before is None
    since = RecordFilter(since="2026-01-01T00:00:05.000Z", until="2026-01-01T00:00:08.000Z")
    assert [r["seq"] for r in store.audit_records(since)] == [6, 7, 8]
    assert [r["seq"] for r in store.audit_records(RecordFilter(after_seq=10))] == [11, 12]
    assert list(store.audit_records(RecordFilter(), frozenset())) == []
    counts = {value: n for value, n, _, _ in store.audit_counts("actor_id")}
    assert counts == {"bot-0": 3, "bot-1": 3, "bot-2": 3, "bot-3": 3}
    newest = store.audit_newest()
    assert newest is not None and newest["seq"] == 12


def test_the_audit_reader_reads_every_store_alike(store: Store) -> None:
    append(store, *(decision(n) for n in range(6)))
    now = datetime(2026, 1, 2, tzinfo=UTC)
    page = query(store, AuditFilter(capabilities=("orders.*",), actor="bot-1"), now=now)
    assert [r["seq"] for r in page.rows] == [6, 2]
    grouped = stats(store, "capability", AuditFilter(), now=now)
    assert grouped.total == 6


def test_pruning_leaves_a_signed_checkpoint_the_chain_verifies_from(
    store: Store, tmp_path: Path
) -> None:
    append(store, *(decision(n) for n in range(10)))
    signer = CheckpointSigner(Ed25519PrivateKey.generate())
    result = prune(store, signer, before="2026-01-01T00:00:05.000Z", now=datetime.now(UTC))
    assert result.records == 5
    checkpoint = store.audit_checkpoint()
    assert checkpoint is not None and checkpoint.seq == 5
    assert next(r["seq"] for r in store.audit_records()) == 6
    assert verify(store, signer).ok


def test_a_row_edited_outside_the_plane_is_refused_and_reported(open_another: Opener) -> None:
    store = open_another()
    store.transact(lambda tx: tx.insert_approval(pending()))
    _tamper(store, "UPDATE approvals SET approvers = 'true || true' WHERE approval_id = 'a1'")
    with pytest.raises(TamperedRow):
        store.get_approval("a1")
    assert store.tampered_rows() == [
        "approvals row a1 fails its integrity check: it was changed outside the plane"
    ]
    assert not verify(store).ok


def test_an_edited_audit_record_fails_verification_at_its_seq(store: Store) -> None:
    append(store, *(decision(n) for n in range(5)))
    _tamper(store, "UPDATE audit_events SET status = 'refused' WHERE seq = 3")
    result = verify(store)
    assert not result.ok and result.first_bad_seq == 3


def _tamper(store: Any, statement: str) -> None:
    """Edit the data as someone with a database shell would."""
    if hasattr(store, "url"):
        with psycopg.connect(store.url, autocommit=True) as conn:
            assert conn.execute(statement).rowcount == 1
    else:
        conn = sqlite3.connect(store.path)
        try:
            assert conn.execute(statement).rowcount == 1
            conn.commit()
        finally:
            conn.close()


def replica(replica_id: str, seen_at: str, **fields: Any) -> ReplicaRecord:
    values: dict[str, Any] = {
        "replica_id": replica_id,
        "host": replica_id.split("/", maxsplit=1)[0],
        "processes": 2,
        "revision": "a" * 64,
        "loaded_at": "2026-01-01T00:00:00+00:00",
        "refused_revision": None,
        "refused_at": None,
        "registrations": 3,
        "leader": False,
        "started_at": "2026-01-01T00:00:00+00:00",
        "seen_at": seen_at,
    }
    values.update(fields)
    return ReplicaRecord(**values)


def test_replicas_report_what_they_serve_to_every_plane(open_another: Opener) -> None:
    one, another = open_another(), open_another()
    a = replica("host-a/1", "2026-01-01T00:10:00+00:00", leader=True)
    b = replica(
        "host-b/2",
        "2026-01-01T00:10:00+00:00",
        refused_revision="b" * 64,
        refused_at="2026-01-01T00:09:00+00:00",
    )
    gone = replica("host-c/3", "2026-01-01T00:01:00+00:00")
    forget_before = "2025-12-31T00:00:00+00:00"
    one.transact(lambda tx: tx.report_replica(a, forget_before=forget_before))
    another.transact(lambda tx: tx.report_replica(b, forget_before=forget_before))
    another.transact(lambda tx: tx.report_replica(gone, forget_before=forget_before))
    assert one.replicas("2026-01-01T00:05:00+00:00") == [a, b]
    assert another.replicas("2026-01-01T00:00:00+00:00") == [a, b, gone]

    settled = replace(
        b, refused_revision=None, refused_at=None, seen_at="2026-01-01T00:11:00+00:00"
    )
    another.transact(lambda tx: tx.report_replica(settled, forget_before=forget_before))
    assert one.replicas("2026-01-01T00:05:00+00:00") == [a, settled]

    one.transact(lambda tx: tx.forget_replica(a.replica_id))
    assert another.replicas("2026-01-01T00:05:00+00:00") == [settled]
    # A replica killed, not stopped, leaves a row that the next report deletes once it is old.
    one.transact(lambda tx: tx.report_replica(a, forget_before="2026-01-01T00:05:00+00:00"))
    assert another.replicas("2000-01-01T00:00:00+00:00") == [a, settled]


def test_one_replica_on_a_database_leads_and_another_takes_over_when_it_stops(
    postgres_url: str, tmp_path: Path
) -> None:
    stores = [open_store(postgres_url, tmp_path / "unused.db") for _ in range(3)]
    try:
        leading = [s for s in stores if s.leads()]
        assert len(leading) == 1
        assert leading[0].leads(), "leadership stays with the replica holding it"
        leading[0].close()
        rest = [s for s in stores if s is not leading[0]]
        assert [s.leads() for s in rest].count(True) == 1
    finally:
        for s in stores:
            s.close()


def compiled_limit(text: str) -> CompiledLimit:
    """The one limit of a policy file whose ``limits:`` section is ``text``."""
    source = PolicySource(Path("policies"), (("limits.yaml", text.encode()),), "test")
    (limit,) = compile_policies(source).limits
    return limit


def test_limits_never_over_admit_across_planes(open_another: Opener) -> None:
    planes = [open_another(), open_another()]
    limits = [
        compiled_limit("limits:\n- {id: r, capabilities: [a.b], rate: 1/hour, burst: 5}"),
        compiled_limit("limits:\n- {id: b, capabilities: [a.b], budget: 10/day, cost: '3'}"),
        compiled_limit("limits:\n- {id: c, capabilities: [a.b], concurrency: 2}"),
    ]
    admitted: list[str] = []
    barrier = threading.Barrier(12)
    now = 1_800_000_000.0

    def call(plane: Store, n: int) -> None:
        barrier.wait()
        for limit in limits:
            cost = 3.0 if limit.kind == "budget" else 1.0
            admission = plane.transact(
                lambda tx, limit=limit, cost=cost: admit(
                    tx,
                    [LimitCall(limit, "acme", cost)],
                    invocation_id=f"inv-{n}-{limit.id}",
                    now=now,
                    grant_expires=now + 60,
                )
            )
            if admission.refusal is None:
                admitted.append(limit.id)
            else:
                assert admission.refusal.retry_after_ms > 0

    threads = [threading.Thread(target=call, args=(planes[n % 2], n)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(admitted) == ["b"] * 3 + ["c"] * 2 + ["r"] * 5
    (usage,) = planes[0].limit_usages("b", "acme", now)
    assert sum(hold.amount for hold in usage.holds) == 9


def test_limit_holds_end_with_their_window_or_when_given_back(store: Store) -> None:
    budget = compiled_limit("limits:\n- {id: b, capabilities: [a.b], budget: 10/min}")
    cap = compiled_limit("limits:\n- {id: c, capabilities: [a.b], concurrency: 1}")
    now = 1_800_000_000.0

    def take(limit: CompiledLimit, invocation_id: str, at: float) -> bool:
        admission = store.transact(
            lambda tx: admit(
                tx,
                [LimitCall(limit, "k", 4.0)],
                invocation_id=invocation_id,
                now=at,
                grant_expires=at + 30,
            )
        )
        return admission.refusal is None

    assert take(budget, "one", now) and take(budget, "two", now + 1)
    assert not take(budget, "three", now + 2)
    assert take(budget, "three", now + 60.5)  # "one" left the window
    assert take(cap, "one", now) and not take(cap, "two", now + 1)
    store.transact(lambda tx: give_back(tx, "one", handler_ran=True, succeeded=True))
    assert take(cap, "two", now + 2)
    assert take(cap, "four", now + 33)  # the grant of "two" expired
    (usage,) = store.limit_usages("b", "k", now + 60.5)
    assert [hold.invocation_id for hold in usage.holds] == ["two", "three"]
    store.transact(lambda tx: give_back(tx, "two", handler_ran=False, succeeded=False))
    (usage,) = store.limit_usages("b", "k", now + 60.5)
    assert [hold.invocation_id for hold in usage.holds] == ["three"]
    assert [u.limit_key for u in store.limit_usages("b", None, now + 60.5)] == ["k"]


def test_work_awaited_from_an_event_loop_is_answered_there_and_a_cancelled_wait_harms_none(
    store: Store,
) -> None:
    """``atransact`` from a coroutine: whether the store commits on a thread
    of its own (PostgreSQL) or on the loop (SQLite, served), each awaiting
    coroutine hears its own result, and one cancelled while it waits leaves
    the others answered."""
    import asyncio

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        store.commit_on(loop)

        def append(status: str) -> Callable[[WriteTransaction], int]:
            return lambda tx: tx.append_audit(AuditEvent(kind="policy", status=status))

        async def many() -> list[int]:
            gone = asyncio.ensure_future(store.atransact(append("gone")))
            kept = [asyncio.ensure_future(store.atransact(append(f"s{i}"))) for i in range(5)]
            await asyncio.sleep(0)
            gone.cancel()
            return list(await asyncio.gather(*kept))

        seqs = asyncio.run_coroutine_threadsafe(many(), loop).result(10)
        assert len(set(seqs)) == 5
        after = store.transact(append("after"))
        assert after > max(seqs)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        loop.close()
