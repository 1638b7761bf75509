"""Group commit: transactions waiting while the writer is busy commit together,
with one fsync, and one that fails is rolled back alone."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from warden_server.audit.reader import verify
from warden_server.records.events import AuditEvent
from warden_server.records.query import RecordFilter
from warden_server.store import SQLiteStore, StoreError, WriteTransaction
from warden_server.store.writer import Job, LoopCommits

WAITING = 10


class Batches:
    def __init__(self) -> None:
        self.seen: list[tuple[int, list[str]]] = []

    def committed(self, transactions: int, events: Sequence[AuditEvent], seconds: float) -> None:
        self.seen.append((transactions, [e.status for e in events]))


def test_transactions_that_wait_commit_together_and_a_failure_is_undone_alone(
    tmp_path: Path,
) -> None:
    batches = Batches()
    store = SQLiteStore(tmp_path / "audit.db", observer=batches)
    gate, inside = threading.Event(), threading.Event()

    def blocker(tx: WriteTransaction) -> int:
        inside.set()
        gate.wait(5)
        return tx.append_audit(AuditEvent(kind="policy", status="first"))

    def append(status: str) -> int:
        def work(tx: WriteTransaction) -> int:
            seq = tx.append_audit(AuditEvent(kind="policy", status=status))
            if status == "doomed":
                raise RuntimeError("this transaction fails after appending")
            return seq

        return store.transact(work)

    results: dict[str, object] = {}

    def run(status: str) -> None:
        try:
            results[status] = append(status)
        except RuntimeError as exc:
            results[status] = exc

    first = threading.Thread(target=lambda: results.setdefault("first", store.transact(blocker)))
    first.start()
    assert inside.wait(5)
    statuses = [f"t{i}" for i in range(WAITING - 1)] + ["doomed"]
    waiting = [threading.Thread(target=run, args=(s,)) for s in statuses]
    for thread in waiting:
        thread.start()
    deadline = time.monotonic() + 5
    while store._queue.qsize() < WAITING and time.monotonic() < deadline:
        time.sleep(0.001)
    gate.set()
    for thread in (first, *waiting):
        thread.join(5)
    try:
        assert [n for n, _ in batches.seen] == [1, WAITING]
        committed = batches.seen[1][1]
        assert "doomed" not in committed and len(committed) == WAITING - 1
        assert isinstance(results["doomed"], RuntimeError)
        seqs = sorted(v for k, v in results.items() if k != "doomed")
        assert seqs == list(range(1, WAITING + 1)), "the failed one left no gap"
        assert verify(store).ok
    finally:
        store.close()


def test_work_that_comes_while_another_process_writes_joins_the_waiting_batch(
    tmp_path: Path,
) -> None:
    """Processes sharing a store take turns; a writer that waited for its turn
    commits what reached its queue meanwhile with the work it was holding."""
    batches = Batches()
    path = tmp_path / "audit.db"
    store = SQLiteStore(path, observer=batches)
    other_process = os.open(f"{path}.writer-lock", os.O_RDWR)
    fcntl.flock(other_process, fcntl.LOCK_EX)

    def append(status: str) -> None:
        store.transact(lambda tx: tx.append_audit(AuditEvent(kind="policy", status=status)))

    threads = [threading.Thread(target=append, args=("held",))]
    threads[0].start()
    deadline = time.monotonic() + 5
    while store._queue.qsize() and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.1)  # the writer holds "held" and waits for its turn
    threads += [threading.Thread(target=append, args=(f"t{i}",)) for i in range(WAITING)]
    for thread in threads[1:]:
        thread.start()
    while store._queue.qsize() < WAITING and time.monotonic() < deadline:
        time.sleep(0.001)
    fcntl.flock(other_process, fcntl.LOCK_UN)
    os.close(other_process)
    for thread in threads:
        thread.join(5)
    try:
        assert [n for n, _ in batches.seen] == [WAITING + 1]
        assert batches.seen[0][1][0] == "held"
        assert verify(store).ok
    finally:
        store.close()


def test_the_works_of_one_transact_each_are_never_split_between_batches(tmp_path: Path) -> None:
    batches = Batches()
    store = SQLiteStore(tmp_path / "audit.db", max_batch=2, observer=batches)
    statuses = [f"t{i}" for i in range(5)]
    try:
        results = store.transact_each(
            [lambda tx, s=s: tx.append_audit(AuditEvent(kind="policy", status=s)) for s in statuses]
        )
        assert results == [1, 2, 3, 4, 5]
        assert batches.seen == [(5, statuses)]
    finally:
        store.close()


def test_a_batch_runs_without_savepoints_until_a_piece_of_work_fails(tmp_path: Path) -> None:
    """Savepoints cost two statements per piece of work: a batch takes them
    only to undo a failure alone, and after a failure the next batch starts
    with them instead of running twice."""
    store = SQLiteStore(tmp_path / "audit.db")
    statements: list[str] = []
    store._write_conn.set_trace_callback(statements.append)

    def append(tx: WriteTransaction) -> int:
        return tx.append_audit(AuditEvent(kind="policy", status="fine"))

    def fail(tx: WriteTransaction) -> int:
        tx.append_audit(AuditEvent(kind="policy", status="undone"))
        raise RuntimeError("refused")

    def run(work: Callable[[WriteTransaction], int]) -> list[str]:
        statements.clear()
        with contextlib.suppress(RuntimeError):
            store.transact(work)
        return [s.split()[0] for s in statements if s.split()[0] in ("SAVEPOINT", "ROLLBACK")]

    try:
        assert run(append) == []
        assert run(fail) == ["ROLLBACK", "SAVEPOINT", "ROLLBACK"]  # again, in a savepoint
        assert run(fail) == ["SAVEPOINT", "ROLLBACK"]  # at once in a savepoint
        assert run(append) == ["SAVEPOINT"]
        assert run(append) == []
        assert [r["status"] for r in store.audit_records(RecordFilter())] == ["fine"] * 3
        assert verify(store).ok
    finally:
        store.close()


def test_work_put_after_the_store_closes_is_refused_not_left_waiting(tmp_path: Path) -> None:
    """A request that passed the store's closed check just before ``close``
    must get an error, not wait for ever behind the writer's stop marker."""
    store = SQLiteStore(tmp_path / "audit.db")
    store.close()
    job: Job[WriteTransaction] = Job(lambda tx: tx.append_audit(AuditEvent(kind="policy")), None)
    with pytest.raises(StoreError, match="closed"):
        store._queue.put([job])
    assert not job.future.done()


@contextlib.contextmanager
def committing_on_a_loop(store: SQLiteStore) -> Iterator[tuple[asyncio.AbstractEventLoop, int]]:
    """``store`` committing from an event loop on a thread of its own, as a
    served store does: the loop and its thread's id. The store is closed,
    then the loop, on the way out."""
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        store.commit_on(loop)
        assert runner.ident is not None
        yield loop, runner.ident
    finally:
        store.close()
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        loop.close()


def test_work_from_the_loop_commits_on_it_in_one_batch_once_the_loop_caught_up(
    tmp_path: Path,
) -> None:
    """A store committing from an event loop (as a served one does) commits
    the work of coroutines that ran in the same stretch of the loop together,
    from the loop's own thread."""
    batches = Batches()
    store = SQLiteStore(tmp_path / "audit.db", observer=batches)
    with committing_on_a_loop(store) as (loop, loop_thread):
        threads: list[int] = []

        def append(status: str) -> Callable[[WriteTransaction], int]:
            def work(tx: WriteTransaction) -> int:
                threads.append(threading.get_ident())
                return tx.append_audit(AuditEvent(kind="policy", status=status))

            return work

        async def many() -> list[int]:
            return list(
                await asyncio.gather(*(store.atransact(append(f"s{i}")) for i in range(WAITING)))
            )

        seqs = asyncio.run_coroutine_threadsafe(many(), loop).result(10)
        assert sorted(seqs) == list(range(seqs[0], seqs[0] + WAITING))
        assert batches.seen[-1] == (WAITING, [f"s{i}" for i in range(WAITING)])
        assert set(threads) == {loop_thread}
        # A blocking caller elsewhere is served by the same loop.
        assert store.transact(append("from a thread")) == seqs[0] + WAITING


def test_a_record_waits_for_company_only_when_the_last_batch_had_some(tmp_path: Path) -> None:
    """A batch of one request's record says the loop's requests come one at a
    time: the next record commits on the loop's next turn instead of after
    the idle turns (at one call in flight, 50-60 µs of every ``Begin``). A
    batch that had company brings the wait back for the next."""
    store = SQLiteStore(tmp_path / "audit.db")
    with committing_on_a_loop(store) as (loop, _):
        turns = [0]
        ticking = [True]

        def tick() -> None:  # counts the loop's turns
            turns[0] += 1
            if ticking[0]:
                loop.call_soon(tick)

        loop.call_soon_threadsafe(tick)

        def turns_to_commit(records: int) -> int:
            """Queue ``records`` records at once; the turns until the first committed."""

            async def queue() -> int:
                queued, committed = turns[0], []

                def work(tx: WriteTransaction) -> int:
                    committed.append(turns[0])
                    return tx.append_audit(AuditEvent(kind="policy", status="alone"))

                await asyncio.gather(*(store.atransact(work) for _ in range(records)))
                return committed[0] - queued

            return asyncio.run_coroutine_threadsafe(queue(), loop).result(5)

        turns_to_commit(2)  # a batch with company: the next record waits
        assert turns_to_commit(1) > LoopCommits.IDLE_TURNS  # and has none
        assert turns_to_commit(1) <= 3
        assert turns_to_commit(1) <= 3
        turns_to_commit(2)
        assert turns_to_commit(1) > LoopCommits.IDLE_TURNS
        ticking[0] = False


@contextlib.contextmanager
def another_process_writing(store: SQLiteStore) -> Iterator[Callable[[], None]]:
    """Hold the writers' lock as another process of the plane would; yields
    how to let go of it."""
    other = os.open(f"{store.path}.writer-lock", os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        yield lambda: fcntl.flock(other, fcntl.LOCK_UN)
    finally:
        os.close(other)


def test_the_loop_goes_on_while_another_process_has_its_turn(tmp_path: Path) -> None:
    """While another process holds the writers' lock, work from the loop waits
    for it without blocking the loop; all of it commits once the lock is free."""
    batches = Batches()
    store = SQLiteStore(tmp_path / "audit.db", observer=batches)
    with committing_on_a_loop(store) as (loop, _), another_process_writing(store) as done:

        def work(tx: WriteTransaction) -> int:
            return tx.append_audit(AuditEvent(kind="policy", status="waited"))

        first = asyncio.run_coroutine_threadsafe(store.atransact(work), loop)
        time.sleep(0.1)  # the loop tried for its turn, and waits for it in a thread
        second = asyncio.run_coroutine_threadsafe(store.atransact(work), loop)

        async def alive() -> str:
            return "answered"

        # The loop answers meanwhile: a commit waiting on the lock would block it.
        assert asyncio.run_coroutine_threadsafe(alive(), loop).result(2) == "answered"
        assert not first.done() and not second.done()
        done()
        earlier, later = first.result(5), second.result(5)
        assert later == earlier + 1
        assert batches.seen[-1] == (2, ["waited", "waited"])


def test_a_caller_that_stops_waiting_leaves_the_rest_of_its_batch_answered(
    tmp_path: Path,
) -> None:
    """A coroutine cancelled while its work waits for the commit (a client
    that hung up on its Begin) must not keep the other work of the batch from
    its answer."""
    batches = Batches()
    store = SQLiteStore(tmp_path / "audit.db", observer=batches)
    with committing_on_a_loop(store) as (loop, _), another_process_writing(store) as done:

        def work(status: str) -> Callable[[WriteTransaction], int]:
            return lambda tx: tx.append_audit(AuditEvent(kind="policy", status=status))

        gone = asyncio.run_coroutine_threadsafe(store.atransact(work("gone")), loop)
        waiting = asyncio.run_coroutine_threadsafe(store.atransact(work("waiting")), loop)
        time.sleep(0.1)
        gone.cancel()
        done()
        seq = waiting.result(5)
        assert batches.seen[-1] == (2, ["gone", "waiting"])
        assert store.transact(work("after")) == seq + 1
