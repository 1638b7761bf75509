"""The SQLite store: WAL, one writer thread with group commit, per-thread readers.

One thread owns the write connection: the store's writer thread, or, once
the store is served, the server's event loop (``commit_on``). Callers hand it
work through a queue;
it takes everything waiting, runs each piece of work in one transaction, and
commits once (``synchronous=FULL``), so many concurrent requests' audit
records become durable with a single fsync. A piece of work that raises is
undone alone: the batch runs again with each piece of work in a SAVEPOINT of
its own (``_run_batch``). The works
of one ``transact_each`` reach the queue as one item, so they are never split
between batches (a batch may pass ``max_batch`` by such a group).

The chain head is read inside each batch's write transaction, so another
process writing to the same file (``warden audit prune`` beside a running
plane) extends the same chain instead of forking it. Processes sharing the
file take turns through a lock file; a writer that had to wait for its turn
takes in what reached its queue meanwhile before it begins, so the busier the
processes, the fewer and larger their commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Final, TypeVar

from warden_server.errors import Conflict
from warden_server.keyfiles import why_not_written
from warden_server.records.chain import GENESIS, record_hash
from warden_server.records.checkpoint import Checkpoint
from warden_server.records.events import COLUMNS, AuditEvent
from warden_server.records.query import EVERYTHING, Page, PageRequest, RecordFilter, Scope
from warden_server.store import audit_sql, replica_sql
from warden_server.store.base import StoreError, StoreObserver, StoreUnreadable, outcomes
from warden_server.store.integrity import SEALED_TABLES, RowSeal, TamperedRow
from warden_server.store.migrations import ROW_MACS_SINCE, migrate
from warden_server.store.records import (
    ApprovalRecord,
    CapabilityRecord,
    IdempotencyRecord,
    InvocationRecord,
    LimitHold,
    LimitUsage,
    ReplicaRecord,
)
from warden_server.store.sealed import ROW_NAMES, Sealed, row_values
from warden_server.store.writer import (
    Job,
    LoopCommits,
    Outcome,
    QueuedWork,
    Ran,
    WorkQueue,
    answer,
    awaited,
    refuse,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

_INSERT_AUDIT = (
    f"INSERT INTO audit_events ({', '.join(COLUMNS)}) "  # noqa: S608 (constant columns)
    f"VALUES ({', '.join(':' + c for c in COLUMNS)})"
)


def _insert(table: str, record_type: type, *, sealed: bool = False) -> str:
    names = [f.name for f in fields(record_type)] + (["mac"] if sealed else [])
    return (
        f"INSERT INTO {table} ({', '.join(names)}) "  # noqa: S608 (dataclass fields)
        f"VALUES ({', '.join(':' + n for n in names)})"
    )


_INSERT_INVOCATION = _insert("invocations", InvocationRecord)
_INSERT_APPROVAL = _insert("approvals", ApprovalRecord, sealed=True)
_UPSERT_REPLICA = replica_sql.upsert(":{}")


_PURGE_BATCH = 100
"""Expired idempotency keys purged per reservation: bounded work per request."""
WRITER_CACHE_KIB = 65_536


SQLITE: Final = audit_sql.Dialect(
    glob=lambda column, param: f"{column} GLOB :{param}",
    glob_value=lambda pattern: pattern,
    # A unary plus keeps SQLite's planner off the column's index.
    off_index=lambda column: f"+{column}",
)


_SQLITE_HEADER: Final = b"SQLite format 3\x00"


def _not_a_database(path: Path) -> bool:
    """Whether ``path`` is a file with something in it other than a SQLite
    database (an empty file, or none, becomes a store)."""
    try:
        with path.open("rb") as file:
            head = file.read(len(_SQLITE_HEADER))
    except OSError:  # missing, or unreadable: opening it says which
        return False
    return bool(head) and head != _SQLITE_HEADER


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


_Job = Job["SQLiteTransaction"]
_Queued = QueuedWork["SQLiteTransaction"]


@dataclass(slots=True)
class _ChainHead:
    """The last record of the chain, as the writer thread sees it."""

    seq: int
    hash: str


class SQLiteTransaction:
    """The writes of one piece of work inside a group-committed transaction."""

    def __init__(self, conn: sqlite3.Connection, head: _ChainHead, sealed: Sealed) -> None:
        self._conn = conn
        self._head = head
        self._sealed = sealed
        self.appended: list[AuditEvent] = []
        """The events appended by the current piece of work."""

    def append_audit(self, event: AuditEvent) -> int:
        row = event.row(self._head.seq + 1, self._head.hash)
        row["hash"] = record_hash(row)
        self._conn.execute(_INSERT_AUDIT, row)
        self._head.seq, self._head.hash = row["seq"], row["hash"]
        self.appended.append(event)
        return self._head.seq

    def audit_hash(self, seq: int) -> str | None:
        row = self._conn.execute("SELECT hash FROM audit_events WHERE seq = ?", (seq,)).fetchone()
        return str(row[0]) if row else None

    def claim_invocation(self, invocation_id: str) -> bool:
        cursor = self._conn.execute(
            "INSERT OR IGNORE INTO decided_invocations (invocation_id) VALUES (?)",
            (invocation_id,),
        )
        return bool(cursor.rowcount == 1)

    def last_policy_event(self) -> tuple[str, str | None] | None:
        row = self._conn.execute(
            "SELECT status, policy_revision FROM audit_events WHERE kind = 'policy' "
            "ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        return (str(row[0]), row[1]) if row else None

    def prune_audit(self, checkpoint: Checkpoint) -> int:
        deleted = self._conn.execute(
            "DELETE FROM audit_events WHERE seq <= ?", (checkpoint.seq,)
        ).rowcount
        self._conn.execute(
            "INSERT INTO audit_checkpoints (seq, hash, created_at, pruned_before, records, "
            "key_id, signature) VALUES (:seq, :hash, :created_at, :pruned_before, :records, "
            ":key_id, :signature)",
            checkpoint.row(),
        )
        self._conn.execute("DELETE FROM audit_checkpoints WHERE seq < ?", (checkpoint.seq,))
        return int(deleted)

    def capability_versions(self, capability_id: str) -> list[CapabilityRecord]:
        rows = self._conn.execute(
            "SELECT * FROM capabilities WHERE id = ? ORDER BY ordinal", (capability_id,)
        )
        return [self._sealed.capability(row) for row in rows]

    def registry_size(self, namespaces: Sequence[str]) -> tuple[int, int]:
        where, params = _in_namespaces(namespaces)
        size = "count(*), coalesce(sum(length(CAST(c.definition AS BLOB))), 0)"
        sql = f"SELECT {size} FROM capabilities c WHERE ({where}) AND {_LATEST}"  # noqa: S608
        row = self._conn.execute(sql, params).fetchone()
        return int(row[0]), int(row[1])

    def insert_capability(self, record: CapabilityRecord) -> None:
        ordinal = self._conn.execute(
            "SELECT coalesce(max(ordinal), 0) + 1 FROM capabilities WHERE id = ?", (record.id,)
        ).fetchone()[0]
        row = asdict(record)
        row["definition"] = json.dumps(record.definition, sort_keys=True)
        row["ordinal"] = ordinal
        self._conn.execute(
            "INSERT INTO capabilities (id, version, service, digest, definition, registered_at, "
            "ordinal, mac) VALUES (:id, :version, :service, :digest, :definition, "
            ":registered_at, :ordinal, :mac)",
            self._sealed.sealed("capabilities", row),
        )

    def insert_invocation(self, record: InvocationRecord) -> None:
        try:
            self._conn.execute(_INSERT_INVOCATION, row_values(record))
        except sqlite3.IntegrityError:
            raise Conflict(f"invocation id {record.invocation_id} was already granted") from None

    def complete_invocation(
        self, invocation_id: str, completed_at: str, *, outcome_seq: int, report_digest: str
    ) -> bool:
        cursor = self._conn.execute(
            "UPDATE invocations SET state = 'completed', completed_at = ?, outcome_seq = ?, "
            "outcome_digest = ? WHERE invocation_id = ? AND state = 'granted'",
            (completed_at, outcome_seq, report_digest, invocation_id),
        )
        return bool(cursor.rowcount == 1)

    def report_replica(self, record: ReplicaRecord, *, forget_before: str) -> None:
        self._conn.execute("DELETE FROM replicas WHERE seen_at < ?", (forget_before,))
        self._conn.execute(_UPSERT_REPLICA, replica_sql.row(record))

    def forget_replica(self, replica_id: str) -> None:
        self._conn.execute("DELETE FROM replicas WHERE replica_id = ?", (replica_id,))

    def insert_approval(self, record: ApprovalRecord) -> None:
        self._conn.execute(_INSERT_APPROVAL, self._sealed.sealed("approvals", row_values(record)))

    def _transition(
        self,
        table: str,
        where: str,
        params: Mapping[str, Any],
        change: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> bool:
        """Change the row ``where`` selects, if any, after checking its MAC, and
        seal it anew; False when no row matches."""
        sql = f"SELECT rowid AS row_id, * FROM {table} WHERE {where}"  # noqa: S608 (fixed)
        found = self._conn.execute(sql, params).fetchone()
        if found is None:
            return False
        values = dict(found)
        row_id = values.pop("row_id")
        current = self._sealed.opened(table, values)
        changes = change(current)
        sealed = self._sealed.sealed(table, {**current, **changes})
        assignments = ", ".join(f"{name} = :{name}" for name in [*changes, "mac"])
        self._conn.execute(
            f"UPDATE {table} SET {assignments} WHERE rowid = :row_id",  # noqa: S608 (fixed)
            {**sealed, "row_id": row_id},
        )
        return True

    def _approval_transition(
        self, approval_id: str, condition: str, params: Mapping[str, Any], **changes: Any
    ) -> bool:
        return self._transition(
            "approvals",
            f"approval_id = :approval_id AND {condition}",
            {**params, "approval_id": approval_id},
            lambda current: {
                name: value(current) if callable(value) else value
                for name, value in changes.items()
            },
        )

    def consume_approval(
        self, approval_id: str, consumed_at: str, *, pending_too: bool = False
    ) -> bool:
        states = "'approved', 'pending'" if pending_too else "'approved'"
        return self._approval_transition(
            approval_id,
            f"state IN ({states}) AND expires_at > :at",
            {"at": consumed_at},
            state="consumed",
            decided_at=lambda current: current["decided_at"] or consumed_at,
        )

    def reserve_idempotency(self, record: IdempotencyRecord, now: str) -> bool:
        self._conn.execute(
            "DELETE FROM idempotency_keys WHERE rowid IN (SELECT rowid FROM idempotency_keys "
            "WHERE expires_at <= ? LIMIT ?)",
            (now, _PURGE_BATCH),
        )
        held = self._conn.execute(
            "SELECT 1 FROM idempotency_keys WHERE service = ? AND capability_id = ? "
            "AND actor_id = ? AND key = ? AND expires_at > ?",
            (record.service, record.capability_id, record.actor_id, record.key, now),
        ).fetchone()
        if held is not None:
            return False
        row = self._sealed.sealed("idempotency_keys", asdict(record))
        self._conn.execute(
            f"INSERT OR REPLACE INTO idempotency_keys ({', '.join(row)}) "  # noqa: S608 (fields)
            f"VALUES ({', '.join(':' + k for k in row)})",
            row,
        )
        return True

    def settle_idempotency(
        self,
        invocation_id: str,
        completed_at: str,
        *,
        status: str,
        failure: str | None,
        executed_before_failure: bool,
        sealed_output: bytes | None,
    ) -> None:
        self._transition(
            "idempotency_keys",
            "invocation_id = :invocation_id AND state = 'in_progress'",
            {"invocation_id": invocation_id},
            lambda current: {
                "state": "completed",
                "completed_at": completed_at,
                "status": status,
                "failure": failure,
                "executed_before_failure": int(executed_before_failure),
                "sealed_output": sealed_output,
            },
        )

    def release_idempotency(self, invocation_id: str) -> None:
        self._conn.execute(
            "DELETE FROM idempotency_keys WHERE invocation_id = ? AND state = 'in_progress'",
            (invocation_id,),
        )

    def limit_usage(self, limit_id: str, limit_key: str, now: float) -> LimitUsage:
        self._conn.execute(
            "DELETE FROM limit_holds WHERE limit_id = ? AND limit_key = ? AND until <= ?",
            (limit_id, limit_key, now),
        )
        return _limit_usage(self._conn, limit_id, limit_key, now)

    def set_limit_bucket(self, limit_id: str, limit_key: str, full_at: float) -> None:
        self._conn.execute(
            "INSERT INTO limit_buckets (limit_id, limit_key, full_at) VALUES (?, ?, ?) "
            "ON CONFLICT (limit_id, limit_key) DO UPDATE SET full_at = excluded.full_at",
            (limit_id, limit_key, full_at),
        )

    def hold_limit(self, hold: LimitHold) -> None:
        self._conn.execute(_INSERT_LIMIT_HOLD, asdict(hold))

    def release_limit_holds(self, invocation_id: str, kinds: Sequence[str]) -> None:
        marks = ", ".join("?" for _ in kinds)
        self._conn.execute(
            f"DELETE FROM limit_holds WHERE invocation_id = ? AND kind IN ({marks})",  # noqa: S608
            (invocation_id, *kinds),
        )

    def decide_approval(
        self, approval_id: str, state: str, decided_by: str, reason: str | None, decided_at: str
    ) -> bool:
        return self._approval_transition(
            approval_id,
            "state = 'pending' AND expires_at > :at",
            {"at": decided_at},
            state=state,
            decided_by=decided_by,
            reason=reason,
            decided_at=decided_at,
        )

    def expire_approval(self, approval_id: str, now: str) -> bool:
        return self._approval_transition(
            approval_id,
            "state IN ('pending', 'approved') AND expires_at <= :at",
            {"at": now},
            state="expired",
        )

    def due_approvals(self, now: str, limit: int) -> list[ApprovalRecord]:
        rows = self._conn.execute(
            "SELECT * FROM approvals WHERE state IN ('pending', 'approved') AND expires_at <= ? "
            "ORDER BY expires_at LIMIT ?",
            (now, limit),
        )
        return self._sealed.each(self._sealed.approval, rows)


class SQLiteStore:
    """The embedded store (see the module docstring for how writes commit)."""

    def __init__(
        self, path: str | Path, *, max_batch: int = 512, observer: StoreObserver | None = None
    ) -> None:
        self.path = Path(path)
        self._observer = observer
        self._reported: set[tuple[str, str]] = set()
        self._head = _ChainHead(0, GENESIS)
        self._open_writer()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._queue = WorkQueue(max_batch)
        self._failed_last = False
        """A piece of work of the last batch failed: run the next with savepoints."""
        self._closed = False
        self.batches_committed = 0
        self._writer = threading.Thread(
            target=self._run_writer, name="warden-store-writer", daemon=True
        )
        self._writer.start()
        self._loop_commits: LoopCommits | None = None

    def _open_writer(self) -> None:
        """Open the write connection and the writers' lock file, migrate the
        schema and read the chain's head.

        Raises:
            StoreError: the file cannot be opened or is not a Warden store.
        """
        if self.path.is_dir():  # SQLite would say only "unable to open database file"
            raise StoreError(f"{self.path}: cannot open the store: it is a folder, not a file")
        if _not_a_database(self.path):
            # Said before the writers' lock file is made beside it: a path
            # that names some other file leaves nothing behind.
            raise StoreError(f"{self.path}: cannot open the store: file is not a database")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Processes sharing the file take turns at writing through this lock,
            # which wakes the next writer the moment it is released; SQLite's own
            # busy handler would have it sleep and retry (up to 100 ms a time).
            turns = os.open(f"{self.path}.writer-lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open the store: {_reason(exc)}") from None
        # Planes starting together on a fresh file open (turning it to WAL),
        # migrate and seal it one at a time: the later ones find it current.
        fcntl.flock(turns, fcntl.LOCK_EX)
        try:
            conn = _connect(self.path)
        except sqlite3.Error as exc:
            fcntl.flock(turns, fcntl.LOCK_UN)
            os.close(turns)
            raise StoreError(f"{self.path}: cannot open the store: {_reason(exc)}") from None
        try:
            self._write_conn, self._turns = conn, turns
            try:
                # Every append updates a dozen indexes: keep their hot pages in memory.
                conn.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                try:
                    migrate(conn)
                except StoreError as exc:
                    raise StoreError(f"{self.path}: cannot open the store: {exc}") from None
                seal = RowSeal.beside(self.path, create=not self._has_sealed_rows())
                self._sealed = Sealed(seal, self._report)
                if version < ROW_MACS_SINCE:
                    self._seal_rows_written_before_macs()
            finally:
                fcntl.flock(turns, fcntl.LOCK_UN)
            self._load_chain_head()
        except StoreError:
            # It names its file already (the store, or the integrity key beside it).
            conn.close()
            os.close(turns)
            raise
        except sqlite3.Error as exc:
            conn.close()
            os.close(turns)
            raise StoreError(f"{self.path}: cannot open the store: {_reason(exc)}") from None

    # -- writing -----------------------------------------------------------

    def commit_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Commit from ``loop``'s thread from now on, instead of the writer
        thread (see ``LoopCommits``): once the writer thread has run what it
        was handed, it ends and the loop takes over."""
        if self._loop_commits is not None or self._closed:
            return
        self._queue.hand_over()
        self._writer.join()
        conn = self._write_conn
        tx = SQLiteTransaction(conn, self._head, self._sealed)
        self._loop_commits = LoopCommits(
            loop,
            self._queue,
            try_turn=self._try_turn,
            take_turn=self._take_turn,
            commit=lambda batch: self._commit_turn(conn, tx, batch),
        )
        self._loop_commits.start()

    def transact(
        self, work: Callable[[SQLiteTransaction], T], *, deadline: float | None = None
    ) -> T:
        if self._closed:
            raise StoreError("the store is closed")
        commits = self._loop_commits
        if commits is not None and commits.thread_id == threading.get_ident():
            raise RuntimeError("transact() on the loop that commits waits forever: use atransact()")
        job = _Job(work, deadline)
        self._queue.put([job])
        result: T = job.future.result()
        return result

    async def atransact(
        self, work: Callable[[SQLiteTransaction], T], *, deadline: float | None = None
    ) -> T:
        result: T = await awaited(self._queue, work, deadline)  # refused once closed
        return result

    def transact_each(
        self, works: Sequence[Callable[[SQLiteTransaction], T]], *, deadline: float | None = None
    ) -> list[T | BaseException]:
        if self._closed:
            raise StoreError("the store is closed")
        jobs = [_Job(work, deadline) for work in works]
        if jobs:
            self._queue.put(jobs)
        return outcomes([job.future for job in jobs])

    # -- integrity of the rows that decide ---------------------------------

    def _has_sealed_rows(self) -> bool:
        return any(
            self._write_conn.execute(
                f"SELECT 1 FROM {table} WHERE mac IS NOT NULL LIMIT 1"  # noqa: S608 (fixed)
            ).fetchone()
            for table in SEALED_TABLES
        )

    def _seal_rows_written_before_macs(self) -> None:
        """Seal the rows of a store written before rows had MACs: once, right
        after the migration that added them, never again (a MAC cleared later
        is a tampered row, not an old one)."""
        conn = self._write_conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            for table in SEALED_TABLES:
                rows = conn.execute(f"SELECT rowid AS row_id, * FROM {table}").fetchall()  # noqa: S608
                for found in rows:
                    values = dict(found)
                    row_id = values.pop("row_id")
                    conn.execute(
                        f"UPDATE {table} SET mac = ? WHERE rowid = ?",  # noqa: S608 (fixed)
                        (self._sealed.seal.mac(table, values), row_id),
                    )

    def _report(self, tampered: TamperedRow) -> None:
        """Log a tampered row and record it in the audit log, once per row."""
        key = (tampered.table, tampered.key)
        if key in self._reported:
            return
        self._reported.add(key)
        log.error("%s: refused, not used", tampered)
        event = AuditEvent(kind="integrity", status="tampered", reason=str(tampered))
        # Recorded by the writer's next batch; the caller does not wait for it.
        with contextlib.suppress(StoreError):  # unless the store is closing
            self._queue.put([_Job(lambda tx: tx.append_audit(event), None)])

    def tampered_rows(self) -> list[str]:
        """Every row of the tables that decide whose MAC does not hold, described."""
        found = []
        for table in SEALED_TABLES:
            for values in self._run(f"SELECT * FROM {table}", {}):  # noqa: S608 (fixed)
                if not self._sealed.seal.holds(table, values):
                    found.append(str(TamperedRow(table, ROW_NAMES[table](values))))
        return found

    def _load_chain_head(self) -> None:
        conn = self._write_conn
        row = conn.execute(
            "SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        if row is None:
            # Everything was pruned: the chain continues from the checkpoint.
            row = conn.execute(
                "SELECT seq, hash FROM audit_checkpoints ORDER BY seq DESC LIMIT 1"
            ).fetchone()
        self._head.seq, self._head.hash = (row["seq"], row["hash"]) if row else (0, GENESIS)

    def _run_writer(self) -> None:
        conn = self._write_conn
        tx = SQLiteTransaction(conn, self._head, self._sealed)
        while (batch := self._queue.next_batch()) is not None:
            self._commit_batch(conn, tx, batch)
        if self._queue.stopping:
            self._close_writer()

    def _close_writer(self) -> None:
        self._write_conn.close()
        os.close(self._turns)

    def _commit_batch(
        self, conn: sqlite3.Connection, tx: SQLiteTransaction, batch: list[_Queued]
    ) -> None:
        self._take_turn()
        self._commit_turn(conn, tx, batch)

    def _take_turn(self) -> None:
        """Wait for the writers' lock: processes sharing the file take turns."""
        fcntl.flock(self._turns, fcntl.LOCK_EX)

    def _try_turn(self) -> bool:
        """Take the writers' lock if no other process holds it."""
        try:
            fcntl.flock(self._turns, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _commit_turn(
        self, conn: sqlite3.Connection, tx: SQLiteTransaction, batch: list[_Queued]
    ) -> None:
        """Commit ``batch`` and what waits beside it in this process's turn, then end the turn."""
        started = time.perf_counter()
        self._queue.take_waiting(batch)  # what came while another process had its turn
        if not batch:
            fcntl.flock(self._turns, fcntl.LOCK_UN)
            return
        try:
            ran = self._run_batch(conn, tx, batch, savepoints=self._failed_last)
            if ran is None:  # a piece of work failed: again, each in a savepoint
                conn.execute("ROLLBACK")
                ran = self._run_batch(conn, tx, batch, savepoints=True)
            assert ran is not None
            self._failed_last = any(failure for _, _, failure in ran[0])
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            log.exception("store commit failed; %d transactions rolled back", len(batch))
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._load_chain_head()
            fcntl.flock(self._turns, fcntl.LOCK_UN)
            refuse(batch, StoreError(f"the store could not commit: {exc}"))
            return
        fcntl.flock(self._turns, fcntl.LOCK_UN)
        self.batches_committed += 1
        answer(ran, batch, self._observer, time.perf_counter() - started)

    def _run_batch(
        self,
        conn: sqlite3.Connection,
        tx: SQLiteTransaction,
        batch: list[_Queued],
        *,
        savepoints: bool,
    ) -> Ran | None:
        """Run the work of ``batch`` in one write transaction, left open.

        With ``savepoints``, each piece of work runs in its own and one that
        raises is undone alone. Without (two statements fewer per piece of
        work, each a wait for the interpreter while other threads run), the
        first one that raises ends the run: None, and the caller rolls back
        and runs the batch again with savepoints. Which way the last batch
        went decides the next, so a stream of refusals pays the second run
        once, not per batch.
        """
        conn.execute("BEGIN IMMEDIATE")
        self._load_chain_head()
        outcomes: list[Outcome] = []
        events: list[AuditEvent] = []
        for job in batch:
            if job.deadline is not None and time.monotonic() > job.deadline:
                # Its requester has stopped waiting: what it would write must not exist.
                outcomes.append((job, None, StoreError("the request's deadline passed")))
                continue
            tx.appended = []
            if not savepoints:
                try:
                    result = job.context.run(job.work, tx)
                except Exception:
                    return None
                outcomes.append((job, result, None))
                events.extend(tx.appended)
                continue
            head = (self._head.seq, self._head.hash)
            conn.execute("SAVEPOINT job")
            try:
                result = job.context.run(job.work, tx)
            except Exception as exc:
                conn.execute("ROLLBACK TO job")
                conn.execute("RELEASE job")
                self._head.seq, self._head.hash = head
                outcomes.append((job, None, exc))
            else:
                conn.execute("RELEASE job")
                outcomes.append((job, result, None))
                events.extend(tx.appended)
        return outcomes, events

    def leads(self) -> bool:
        # The processes sharing a file are one plane: its first process, the
        # only one that starts the periodic work, does it.
        return True

    # -- reading -----------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path)
            conn.execute("PRAGMA query_only = ON")
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def get_capability(self, capability_id: str, version: str) -> CapabilityRecord | None:
        row = (
            self._reader()
            .execute(
                "SELECT * FROM capabilities WHERE id = ? AND version = ?", (capability_id, version)
            )
            .fetchone()
        )
        return self._sealed.capability(row) if row else None

    def approval_transitions(
        self, after_seq: int, through_seq: int, limit: int
    ) -> list[tuple[int, str, str]]:
        rows = self._reader().execute(
            "SELECT seq, status, approval_id FROM audit_events "
            "WHERE seq > ? AND seq <= ? AND kind = 'approval' ORDER BY seq LIMIT ?",
            (after_seq, through_seq, limit),
        )
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def last_seq(self) -> int:
        row = self._reader().execute("SELECT max(seq) FROM audit_events").fetchone()
        return int(row[0] or 0)

    def latest_version(self, capability_id: str) -> str | None:
        row = (
            self._reader()
            .execute(
                "SELECT version FROM capabilities WHERE id = ? ORDER BY ordinal DESC LIMIT 1",
                (capability_id,),
            )
            .fetchone()
        )
        return str(row[0]) if row else None

    def latest_capabilities(
        self, namespaces: Sequence[str] | None = None
    ) -> list[CapabilityRecord]:
        if namespaces is None:
            rows = self._reader().execute(
                "SELECT c.* FROM capabilities c JOIN (SELECT id, max(ordinal) AS ordinal "
                "FROM capabilities GROUP BY id) latest USING (id, ordinal) ORDER BY c.id"
            )
        else:
            where, params = _in_namespaces(namespaces)
            rows = self._reader().execute(
                f"SELECT c.* FROM capabilities c WHERE ({where}) AND {_LATEST} "  # noqa: S608
                "ORDER BY c.id",
                params,
            )
        return self._sealed.each(self._sealed.capability, rows)

    def every_capability_version(self) -> list[CapabilityRecord]:
        rows = self._reader().execute("SELECT * FROM capabilities ORDER BY id, ordinal")
        return self._sealed.each(self._sealed.capability, rows)

    def get_invocation(self, invocation_id: str) -> InvocationRecord | None:
        row = (
            self._reader()
            .execute("SELECT * FROM invocations WHERE invocation_id = ?", (invocation_id,))
            .fetchone()
        )
        return InvocationRecord(**dict(row)) if row else None

    def replicas(self, seen_since: str) -> list[ReplicaRecord]:
        rows = self._reader().execute(
            "SELECT * FROM replicas WHERE seen_at >= ? ORDER BY host, replica_id", (seen_since,)
        )
        return [replica_sql.record(r) for r in rows]

    def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        row = (
            self._reader()
            .execute("SELECT * FROM approvals WHERE approval_id = ?", (approval_id,))
            .fetchone()
        )
        return self._sealed.approval(row) if row else None

    def get_idempotency(
        self, service: str, capability_id: str, actor_id: str, key: str
    ) -> IdempotencyRecord | None:
        row = (
            self._reader()
            .execute(
                "SELECT * FROM idempotency_keys WHERE service = ? AND capability_id = ? "
                "AND actor_id = ? AND key = ?",
                (service, capability_id, actor_id, key),
            )
            .fetchone()
        )
        return self._sealed.idempotency(row) if row else None

    def idempotency_of(self, invocation_id: str) -> IdempotencyRecord | None:
        row = (
            self._reader()
            .execute("SELECT * FROM idempotency_keys WHERE invocation_id = ?", (invocation_id,))
            .fetchone()
        )
        return self._sealed.idempotency(row) if row else None

    def list_approvals(
        self, tenant: str, states: Sequence[str] = (), limit: int = 100
    ) -> list[ApprovalRecord]:
        sql = "SELECT * FROM approvals WHERE tenant = ?"
        params: list[Any] = [tenant]
        if states:
            sql += f" AND state IN ({', '.join('?' for _ in states)})"
            params.extend(states)
        sql += " ORDER BY created_at DESC, approval_id LIMIT ?"
        params.append(int(limit))
        return self._sealed.each(self._sealed.approval, self._reader().execute(sql, params))

    def _run(self, sql: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Rows of a read as column dicts; a damaged file is ``StoreUnreadable``."""
        try:
            for row in self._reader().execute(sql, params):
                yield dict(row)
        except sqlite3.DatabaseError as exc:
            raise StoreUnreadable(str(exc)) from None

    def limit_usages(
        self, limit_id: str, limit_key: str | None, now: float, limit: int = 100
    ) -> list[LimitUsage]:
        conn = self._reader()
        if limit_key is not None:
            return [_limit_usage(conn, limit_id, limit_key, now)]
        keys = conn.execute(
            "SELECT limit_key FROM limit_buckets WHERE limit_id = ? AND full_at > ? "
            "UNION SELECT limit_key FROM limit_holds WHERE limit_id = ? AND until > ? "
            "ORDER BY limit_key LIMIT ?",
            (limit_id, now, limit_id, now, limit),
        ).fetchall()
        return [_limit_usage(conn, limit_id, key, now) for (key,) in keys]

    def audit_page(self, f: RecordFilter, scope: Scope, page: PageRequest) -> Page:
        return audit_sql.page(self._run, f, scope, page, SQLITE)

    def audit_records(
        self, f: RecordFilter = EVERYTHING, scope: Scope = None, *, limit: int | None = None
    ) -> Iterator[dict[str, Any]]:
        return audit_sql.records(self._run, f, scope, SQLITE, limit)

    def audit_newest(self) -> dict[str, Any] | None:
        return next(self._run(f"{audit_sql.SELECT_RECORDS} ORDER BY seq DESC LIMIT 1", {}), None)

    def audit_counts(
        self, column: str, f: RecordFilter = EVERYTHING, scope: Scope = None
    ) -> list[tuple[Any, int, str, str]]:
        return audit_sql.counts(self._run, column, f, scope, SQLITE)

    def audit_checkpoint(self) -> Checkpoint | None:
        sql = "SELECT * FROM audit_checkpoints ORDER BY seq DESC LIMIT 1"
        row = next(self._run(sql, {}), None)
        return Checkpoint(**row) if row else None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.stop()
        if self._loop_commits is None:
            self._writer.join()
        else:
            self._loop_commits.finish(self._close_writer)
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()


_LATEST: Final = "c.ordinal = (SELECT max(ordinal) FROM capabilities WHERE id = c.id)"
"""The newest version of each id, found through the (id, ordinal) index."""


_INSERT_LIMIT_HOLD = _insert("limit_holds", LimitHold)


def _limit_usage(conn: sqlite3.Connection, limit_id: str, limit_key: str, now: float) -> LimitUsage:
    bucket = conn.execute(
        "SELECT full_at FROM limit_buckets WHERE limit_id = ? AND limit_key = ?",
        (limit_id, limit_key),
    ).fetchone()
    holds = conn.execute(
        "SELECT limit_id, limit_key, invocation_id, kind, amount, at, until FROM limit_holds "
        "WHERE limit_id = ? AND limit_key = ? AND until > ? ORDER BY until, rowid",
        (limit_id, limit_key, now),
    ).fetchall()
    return LimitUsage(
        limit_id,
        limit_key,
        float(bucket[0]) if bucket else None,
        tuple(LimitHold(*row) for row in holds),
    )


def _in_namespaces(namespaces: Sequence[str]) -> tuple[str, list[str]]:
    """A WHERE clause over ``c.id`` for the ids in these namespaces: each a
    range of the primary key (``orders.`` up to ``orders/``, the character
    after the dot), so the cost follows those namespaces' capabilities and
    no one else's."""
    if not namespaces:
        return "0", []
    terms, params = [], []
    for namespace in namespaces:
        terms.append("c.id = ? OR (c.id > ? AND c.id < ?)")
        params += [namespace, namespace + ".", namespace + "/"]
    return " OR ".join(f"({t})" for t in terms), params


def _reason(exc: BaseException) -> str:
    """Why a file could not be opened, without Python's wrapping of it."""
    if isinstance(exc, OSError):
        return why_not_written(exc)
    return str(exc)


def made_by_a_plane(path: Path) -> bool | None:
    """Whether the SQLite file at ``path`` holds Warden's schema (a plane made
    it), read without writing a byte; None when SQLite cannot read it at all."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            return bool(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.DatabaseError:
        return None


def damage(path: Path) -> list[str]:
    """What SQLite's ``quick_check`` finds wrong in a store file (nothing when
    it is sound), which a walk of the chain alone would miss in an index.

    Raises:
        StoreUnreadable: the file cannot be read as a SQLite database.
    """
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            found = [
                line.strip()
                for (text,) in conn.execute("PRAGMA quick_check")
                for line in str(text).splitlines()
                if line.strip() and not line.startswith("*** in database")
            ]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise StoreUnreadable(str(exc)) from None
    return [] if found == ["ok"] else found
