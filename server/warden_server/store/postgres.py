"""The PostgreSQL store: any number of planes (replicas) over one database.

Writes commit as in the SQLite store: one writer thread per plane takes every
request waiting, runs each one's work in its own savepoint of one transaction
and commits once, so many requests' records become durable together. Each
batch first locks the chain's head row (``chain_head``, ``FOR UPDATE``): the
batches of every replica take turns, each extends the one hash chain from
where the last left it, and (READ COMMITTED, a fresh snapshot per statement)
sees everything committed before it: an invocation id is claimed once, an
idempotency key reserved once, an approval decided once, cluster-wide.

Readers use a connection pool. Migrations run under an advisory lock, so
replicas starting together on an empty database migrate it once. The
connection string follows libpq: the password comes from ``PGPASSWORD``, a
``.pgpass`` file or a service file, never from the plane's config.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Final, TypeVar

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from warden_server.errors import Conflict
from warden_server.records.chain import GENESIS, record_hash
from warden_server.records.checkpoint import Checkpoint
from warden_server.records.events import COLUMNS, AuditEvent
from warden_server.records.query import EVERYTHING, Page, PageRequest, RecordFilter, Scope
from warden_server.store import audit_sql, replica_sql
from warden_server.store.base import StoreError, StoreObserver, outcomes
from warden_server.store.integrity import SEALED_TABLES, IntegrityKeyMissing, RowSeal, TamperedRow
from warden_server.store.pg_schema import migrate
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

SCHEMES: Final = ("postgresql", "postgres")
"""URL schemes of a PostgreSQL store."""
LEADER_LOCK: Final = 0x57415244454E4C44
"""The advisory lock whose holder runs the cluster's periodic work."""
READ_WAIT_S: Final = 3.0
"""How long a read waits for a connection of the reader pool. With the
database down, the pool has none to give: a read then fails after this long
(UNAVAILABLE) within the SDK's 5 s governance timeout, not after psycopg's 30 s."""
_PURGE_BATCH = 100


class _RunAgain(Exception):
    """A piece of work failed in a batch run without savepoints."""


_KEY_CHECK = {"check": "the integrity key of this database"}

_INSERT_AUDIT = (
    f"INSERT INTO audit_events ({', '.join(COLUMNS)}) "  # noqa: S608 (constant columns)
    f"VALUES ({', '.join(f'%({c})s' for c in COLUMNS)})"
)


def _insert(table: str, names: Sequence[str]) -> str:
    return (
        f"INSERT INTO {table} ({', '.join(names)}) "  # noqa: S608 (fixed names)
        f"VALUES ({', '.join(f'%({n})s' for n in names)})"
    )


_INSERT_INVOCATION = _insert("invocations", [f.name for f in fields(InvocationRecord)])
_APPROVAL_COLUMNS = [*(f.name for f in fields(ApprovalRecord)), "mac"]
_INSERT_APPROVAL = _insert("approvals", _APPROVAL_COLUMNS)
_UPSERT_REPLICA = replica_sql.upsert("%({})s")
_IDEMPOTENCY_COLUMNS = [*(f.name for f in fields(IdempotencyRecord)), "mac"]
_KEY_COLUMNS = ("service", "capability_id", "actor_id", "key")
_UPSERT_IDEMPOTENCY = _insert("idempotency_keys", _IDEMPOTENCY_COLUMNS) + (
    " ON CONFLICT (service, capability_id, actor_id, key) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _IDEMPOTENCY_COLUMNS if c not in _KEY_COLUMNS)
)
_NAMED = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


def _pg(text: str) -> str:
    """An audit query's ``:name`` parameters as psycopg's ``%(name)s``."""
    return _NAMED.sub(r"%(\1)s", text)


def _glob_regex(pattern: str) -> str:
    """A GLOB pattern (``*``, ``?``, ``[...]``, ``[!...]``) as an anchored POSIX regex."""
    out, i = ["^"], 0
    while i < len(pattern):
        char = pattern[i]
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out) + "$"


POSTGRES: Final = audit_sql.Dialect(
    glob=lambda column, param: f"{column} ~ :{param}",
    glob_value=_glob_regex,
    # A regular expression over an expression never uses the column's index.
    off_index=lambda column: f"({column} || '')",
)


def redacted(url: str) -> str:
    """A connection string fit for a log line: any password replaced."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


_Job = Job["PostgresTransaction"]
_Queued = QueuedWork["PostgresTransaction"]


class PostgresTransaction:
    """The writes of one piece of work inside a group-committed transaction."""

    def __init__(self, conn: psycopg.Connection[dict[str, Any]], sealed: Sealed) -> None:
        self._conn = conn
        self._sealed = sealed
        self.seq = 0
        self.hash = GENESIS
        self.appended: list[AuditEvent] = []

    def _one(self, query: str, params: Any = None) -> dict[str, Any] | None:
        return self._conn.execute(query, params).fetchone()

    def append_audit(self, event: AuditEvent) -> int:
        row = event.row(self.seq + 1, self.hash)
        row["hash"] = record_hash(row)
        self._conn.execute(_INSERT_AUDIT, row)
        self.seq, self.hash = row["seq"], row["hash"]
        self.appended.append(event)
        return self.seq

    def audit_hash(self, seq: int) -> str | None:
        row = self._one("SELECT hash FROM audit_events WHERE seq = %s", (seq,))
        return str(row["hash"]) if row else None

    def claim_invocation(self, invocation_id: str) -> bool:
        cursor = self._conn.execute(
            "INSERT INTO decided_invocations (invocation_id) VALUES (%s) ON CONFLICT DO NOTHING",
            (invocation_id,),
        )
        return cursor.rowcount == 1

    def last_policy_event(self) -> tuple[str, str | None] | None:
        row = self._one(
            "SELECT status, policy_revision FROM audit_events WHERE kind = 'policy' "
            "ORDER BY seq DESC LIMIT 1"
        )
        return (str(row["status"]), row["policy_revision"]) if row else None

    def prune_audit(self, checkpoint: Checkpoint) -> int:
        deleted = self._conn.execute(
            "DELETE FROM audit_events WHERE seq <= %s", (checkpoint.seq,)
        ).rowcount
        self._conn.execute(_insert("audit_checkpoints", list(checkpoint.row())), checkpoint.row())
        self._conn.execute("DELETE FROM audit_checkpoints WHERE seq < %s", (checkpoint.seq,))
        return int(deleted)

    def capability_versions(self, capability_id: str) -> list[CapabilityRecord]:
        rows = self._conn.execute(
            "SELECT * FROM capabilities WHERE id = %s ORDER BY ordinal", (capability_id,)
        )
        return [self._sealed.capability(row) for row in rows]

    def registry_size(self, namespaces: Sequence[str]) -> tuple[int, int]:
        where, params = in_namespaces(namespaces)
        size = "count(*) AS n, coalesce(sum(octet_length(c.definition)), 0) AS bytes"
        query = f"SELECT {size} FROM capabilities c WHERE ({where}) AND {LATEST}"  # noqa: S608
        row = self._one(query, params)
        assert row is not None
        return int(row["n"]), int(row["bytes"])

    def insert_capability(self, record: CapabilityRecord) -> None:
        found = self._one(
            "SELECT coalesce(max(ordinal), 0) + 1 AS next FROM capabilities WHERE id = %s",
            (record.id,),
        )
        assert found is not None
        row = asdict(record)
        row["definition"] = json.dumps(record.definition, sort_keys=True)
        row["ordinal"] = found["next"]
        sealed = self._sealed.sealed("capabilities", row)
        self._conn.execute(_insert("capabilities", list(sealed)), sealed)

    def insert_invocation(self, record: InvocationRecord) -> None:
        try:
            with self._conn.transaction():
                self._conn.execute(_INSERT_INVOCATION, row_values(record))
        except psycopg.errors.UniqueViolation:
            raise Conflict(f"invocation id {record.invocation_id} was already granted") from None

    def complete_invocation(
        self, invocation_id: str, completed_at: str, *, outcome_seq: int, report_digest: str
    ) -> bool:
        cursor = self._conn.execute(
            "UPDATE invocations SET state = 'completed', completed_at = %s, outcome_seq = %s, "
            "outcome_digest = %s WHERE invocation_id = %s AND state = 'granted'",
            (completed_at, outcome_seq, report_digest, invocation_id),
        )
        return cursor.rowcount == 1

    def report_replica(self, record: ReplicaRecord, *, forget_before: str) -> None:
        self._conn.execute("DELETE FROM replicas WHERE seen_at < %s", (forget_before,))
        self._conn.execute(_UPSERT_REPLICA, replica_sql.row(record))

    def forget_replica(self, replica_id: str) -> None:
        self._conn.execute("DELETE FROM replicas WHERE replica_id = %s", (replica_id,))

    def insert_approval(self, record: ApprovalRecord) -> None:
        self._conn.execute(_INSERT_APPROVAL, self._sealed.sealed("approvals", row_values(record)))

    def _transition(
        self,
        table: str,
        where: str,
        params: dict[str, Any],
        change: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> bool:
        """Change the row ``where`` selects, if any, after checking its MAC, and
        seal it anew; False when no row matches."""
        found = self._one(
            f"SELECT ctid AS row_id, * FROM {table} WHERE {where} FOR UPDATE",  # noqa: S608
            params,
        )
        if found is None:
            return False
        values = dict(found)
        row_id = values.pop("row_id")
        current = self._sealed.opened(table, values)
        changes = change(current)
        sealed = self._sealed.sealed(table, {**current, **changes})
        assignments = ", ".join(f"{name} = %({name})s" for name in [*changes, "mac"])
        self._conn.execute(
            f"UPDATE {table} SET {assignments} WHERE ctid = %(row_id)s",  # noqa: S608 (fixed)
            {**sealed, "row_id": row_id},
        )
        return True

    def _approval_transition(
        self, approval_id: str, condition: str, at: str, **changes: Any
    ) -> bool:
        return self._transition(
            "approvals",
            f"approval_id = %(approval_id)s AND {condition}",
            {"approval_id": approval_id, "at": at},
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
            f"state IN ({states}) AND expires_at > %(at)s",
            consumed_at,
            state="consumed",
            decided_at=lambda current: current["decided_at"] or consumed_at,
        )

    def decide_approval(
        self, approval_id: str, state: str, decided_by: str, reason: str | None, decided_at: str
    ) -> bool:
        return self._approval_transition(
            approval_id,
            "state = 'pending' AND expires_at > %(at)s",
            decided_at,
            state=state,
            decided_by=decided_by,
            reason=reason,
            decided_at=decided_at,
        )

    def expire_approval(self, approval_id: str, now: str) -> bool:
        return self._approval_transition(
            approval_id,
            "state IN ('pending', 'approved') AND expires_at <= %(at)s",
            now,
            state="expired",
        )

    def due_approvals(self, now: str, limit: int) -> list[ApprovalRecord]:
        rows = self._conn.execute(
            "SELECT * FROM approvals WHERE state IN ('pending', 'approved') "
            "AND expires_at <= %s ORDER BY expires_at LIMIT %s",
            (now, limit),
        )
        return self._sealed.each(self._sealed.approval, rows)

    def reserve_idempotency(self, record: IdempotencyRecord, now: str) -> bool:
        self._conn.execute(
            "DELETE FROM idempotency_keys WHERE ctid IN (SELECT ctid FROM idempotency_keys "
            "WHERE expires_at <= %s LIMIT %s)",
            (now, _PURGE_BATCH),
        )
        held = self._one(
            "SELECT 1 AS held FROM idempotency_keys WHERE service = %s AND capability_id = %s "
            "AND actor_id = %s AND key = %s AND expires_at > %s",
            (record.service, record.capability_id, record.actor_id, record.key, now),
        )
        if held is not None:
            return False
        row = self._sealed.sealed("idempotency_keys", asdict(record))
        if row["executed_before_failure"] is not None:
            row["executed_before_failure"] = int(row["executed_before_failure"])
        self._conn.execute(_UPSERT_IDEMPOTENCY, row)
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
            "invocation_id = %(invocation_id)s AND state = 'in_progress'",
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
            "DELETE FROM idempotency_keys WHERE invocation_id = %s AND state = 'in_progress'",
            (invocation_id,),
        )

    def limit_usage(self, limit_id: str, limit_key: str, now: float) -> LimitUsage:
        self._conn.execute(
            "DELETE FROM limit_holds WHERE limit_id = %s AND limit_key = %s AND until <= %s",
            (limit_id, limit_key, now),
        )
        return _limit_usage(self._conn, limit_id, limit_key, now)

    def set_limit_bucket(self, limit_id: str, limit_key: str, full_at: float) -> None:
        self._conn.execute(
            "INSERT INTO limit_buckets (limit_id, limit_key, full_at) VALUES (%s, %s, %s) "
            "ON CONFLICT (limit_id, limit_key) DO UPDATE SET full_at = excluded.full_at",
            (limit_id, limit_key, full_at),
        )

    def hold_limit(self, hold: LimitHold) -> None:
        self._conn.execute(_INSERT_LIMIT_HOLD, asdict(hold))

    def release_limit_holds(self, invocation_id: str, kinds: Sequence[str]) -> None:
        self._conn.execute(
            "DELETE FROM limit_holds WHERE invocation_id = %s AND kind = ANY(%s)",
            (invocation_id, list(kinds)),
        )


_INSERT_LIMIT_HOLD = _insert("limit_holds", [f.name for f in fields(LimitHold)])


def _limit_usage(
    conn: psycopg.Connection[dict[str, Any]], limit_id: str, limit_key: str, now: float
) -> LimitUsage:
    bucket = conn.execute(
        "SELECT full_at FROM limit_buckets WHERE limit_id = %s AND limit_key = %s",
        (limit_id, limit_key),
    ).fetchone()
    holds = conn.execute(
        "SELECT limit_id, limit_key, invocation_id, kind, amount, at, until FROM limit_holds "
        "WHERE limit_id = %s AND limit_key = %s AND until > %s ORDER BY until, id",
        (limit_id, limit_key, now),
    ).fetchall()
    return LimitUsage(
        limit_id,
        limit_key,
        float(bucket["full_at"]) if bucket else None,
        tuple(LimitHold(**row) for row in holds),
    )


class PostgresStore:
    """The replicated store (see the module docstring for how writes commit).

    Args:
        url: A libpq connection string (``postgresql://host/db``); the password
            comes from libpq's environment, ``.pgpass`` or service file.
        key_base: The path beside which the integrity key lives
            (``<key_base>.integrity-key``), unless ``integrity_key_file`` names it.
    """

    def __init__(
        self,
        url: str,
        *,
        key_base: Path,
        max_batch: int = 512,
        observer: StoreObserver | None = None,
        readers: int = 8,
    ) -> None:
        self.url = url
        self.path = key_base
        self._observer = observer
        self._reported: set[tuple[str, str]] = set()
        self._closed = False
        self.batches_committed = 0
        self._leader: psycopg.Connection[Any] | None = None
        self._leader_lock = threading.Lock()
        self._write_conn = self._connect()
        try:
            with self._write_conn.transaction():
                try:
                    migrate(self._write_conn)
                except StoreError as exc:
                    raise StoreError(f"{redacted(url)}: cannot open the store: {exc}") from None
            self._sealed = Sealed(self._integrity_key(), self._report)
            self._pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] = ConnectionPool(
                url,
                min_size=1,
                max_size=readers,
                kwargs={"autocommit": True, "row_factory": dict_row},
                open=True,
                timeout=READ_WAIT_S,
                name="warden-readers",
            )
        except BaseException:
            self._write_conn.close()
            raise
        self._queue = WorkQueue(max_batch)
        self._failed_last = False
        """A piece of work of the last batch failed: run the next with savepoints."""
        self._writer = threading.Thread(
            target=self._run_writer, name="warden-store-writer", daemon=True
        )
        self._writer.start()

    def _connect(self) -> psycopg.Connection[dict[str, Any]]:
        try:
            return psycopg.connect(
                self.url, autocommit=True, row_factory=dict_row, application_name="warden"
            )
        except psycopg.Error as exc:
            raise StoreError(f"{redacted(self.url)}: cannot connect: {_reason(exc)}") from None

    def _integrity_key(self) -> RowSeal:
        """The integrity key, checked against the one the database's rows are
        sealed with (its fingerprint is in ``store_meta``): replicas on other
        hosts must be given the same key file."""
        conn = self._write_conn
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (LEADER_LOCK + 1,))
            found = conn.execute(
                "SELECT value FROM store_meta WHERE name = 'integrity_key'"
            ).fetchone()
            try:
                seal = RowSeal.beside(self.path, create=found is None)
            except IntegrityKeyMissing:
                raise StoreError(
                    f"the database's rows are sealed with an integrity key, but "
                    f"{self.path}.integrity-key is missing: copy it from another replica"
                ) from None
            fingerprint = seal.mac("store_meta", _KEY_CHECK)
            if found is None:
                conn.execute(
                    "INSERT INTO store_meta (name, value) VALUES ('integrity_key', %s)",
                    (fingerprint,),
                )
            elif found["value"] != fingerprint:
                raise StoreError(
                    f"{self.path}.integrity-key is not the key this database's rows are "
                    "sealed with: give every replica the same key file"
                )
        return seal

    def agree_on_keys(
        self, *, signing: str, published: Sequence[str], replay_check: str, where: str
    ) -> None:
        """Refuse to serve with keys the other replicas on this database do not
        share: a grant signing key none of them accepts (the outcomes reported
        to them would be refused), or another idempotency replay key (their
        replays would not open here). ``signing`` and ``published`` are key ids
        (the signing key and every key this replica accepts), ``replay_check``
        a fingerprint of the replay key, ``where`` the signing key's file.

        The database keeps every grant key id a replica has accepted: a
        rotation lists the new key as a verification key on every replica
        first (docs/grants.md), and the new key is then known when it signs.

        Raises:
            StoreError: a key is not the one the other replicas use.
        """
        conn = self._write_conn
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (LEADER_LOCK + 1,))
            rows = conn.execute(
                "SELECT name, value FROM store_meta WHERE name IN ('grant_keys', 'replay_key')"
            ).fetchall()
            found = {row["name"]: row["value"] for row in rows}
            known = set(found["grant_keys"].split(",")) if "grant_keys" in found else set()
            if known and signing not in known:
                raise StoreError(
                    f"{where} (grant key {signing}) is not a grant key the other replicas on "
                    "this database accept: copy the signing key file from another replica, "
                    "or rotate by listing the new key in every replica's [grants] "
                    "verification_key_files first"
                )
            if found.get("replay_key", replay_check) != replay_check:
                raise StoreError(
                    "the idempotency replay key ([idempotency] replay_key, or the "
                    "replay-key file beside the store) is not the one the other replicas "
                    "on this database seal replays with: give every replica the same key"
                )
            conn.execute(
                "INSERT INTO store_meta (name, value) VALUES ('grant_keys', %s), "
                "('replay_key', %s) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
                (",".join(sorted(known | {signing, *published})), replay_check),
            )

    # -- writing -----------------------------------------------------------

    def transact(
        self, work: Callable[[PostgresTransaction], T], *, deadline: float | None = None
    ) -> T:
        if self._closed:
            raise StoreError("the store is closed")
        job = _Job(work, deadline)
        self._queue.put([job])
        result: T = job.future.result()
        return result

    def commit_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Commits stay on the writer thread: each waits on the network, which
        would stop the loop."""

    async def atransact(
        self, work: Callable[[PostgresTransaction], T], *, deadline: float | None = None
    ) -> T:
        result: T = await awaited(self._queue, work, deadline)  # refused once closed
        return result

    def transact_each(
        self, works: Sequence[Callable[[PostgresTransaction], T]], *, deadline: float | None = None
    ) -> list[T | BaseException]:
        if self._closed:
            raise StoreError("the store is closed")
        jobs = [_Job(work, deadline) for work in works]
        if jobs:
            self._queue.put(jobs)
        return outcomes([job.future for job in jobs])

    def _report(self, tampered: TamperedRow) -> None:
        key = (tampered.table, tampered.key)
        if key in self._reported:
            return
        self._reported.add(key)
        log.error("%s: refused, not used", tampered)
        event = AuditEvent(kind="integrity", status="tampered", reason=str(tampered))
        # Recorded by the writer's next batch; the caller does not wait for it.
        with contextlib.suppress(StoreError):  # unless the store is closing
            self._queue.put([_Job(lambda tx: tx.append_audit(event), None)])

    def _run_writer(self) -> None:
        while (batch := self._queue.next_batch()) is not None:
            self._commit_batch(batch)
        self._write_conn.close()

    def _commit_batch(self, batch: list[_Queued]) -> None:
        started = time.perf_counter()
        try:
            if self._write_conn.closed:
                self._write_conn = self._connect()
            conn = self._write_conn
            tx = PostgresTransaction(conn, self._sealed)
            ran = self._run_batch(conn, tx, batch, savepoints=self._failed_last)
            if ran is None:  # a piece of work failed: again, each in a savepoint
                ran = self._run_batch(conn, tx, batch, savepoints=True)
            assert ran is not None
            self._failed_last = any(failure for _, _, failure in ran[0])
        except (psycopg.Error, StoreError) as exc:
            log.error("store commit failed (%s); %d transactions rolled back", exc, len(batch))
            if not self._write_conn.closed and self._write_conn.broken:
                self._write_conn.close()
            refuse(batch, StoreError(f"the store could not commit: {_reason(exc)}"))
            return
        self.batches_committed += 1
        answer(ran, batch, self._observer, time.perf_counter() - started)

    def _run_batch(
        self,
        conn: psycopg.Connection[Any],
        tx: PostgresTransaction,
        batch: list[_Queued],
        *,
        savepoints: bool,
    ) -> Ran | None:
        """Run and commit the work of ``batch`` in one transaction, as the
        SQLite store does (``SQLiteStore._run_batch``): without savepoints (two
        round trips fewer per piece of work) the first piece of work that
        raises rolls the whole back and returns None; with them, each is
        undone alone."""
        outcomes: list[Outcome] = []
        events: list[AuditEvent] = []
        try:
            with conn.transaction():
                # Every replica's batches take turns here, and extend one chain.
                head = conn.execute(
                    "SELECT seq, hash FROM chain_head WHERE id = 1 FOR UPDATE"
                ).fetchone()
                assert head is not None
                self._queue.take_waiting(batch)  # what came while another replica had its turn
                tx.seq, tx.hash = int(head["seq"]), str(head["hash"])
                for job in batch:
                    if job.deadline is not None and time.monotonic() > job.deadline:
                        outcomes.append((job, None, StoreError("the request's deadline passed")))
                        continue
                    before = (tx.seq, tx.hash)
                    tx.appended = []
                    try:
                        if savepoints:
                            with conn.transaction():
                                result = job.context.run(job.work, tx)
                        else:
                            result = job.context.run(job.work, tx)
                    except psycopg.OperationalError:
                        raise
                    except Exception as exc:
                        if not savepoints:
                            raise _RunAgain from exc
                        tx.seq, tx.hash = before
                        outcomes.append((job, None, exc))
                    else:
                        outcomes.append((job, result, None))
                        events.extend(tx.appended)
                conn.execute(
                    "UPDATE chain_head SET seq = %s, hash = %s WHERE id = 1", (tx.seq, tx.hash)
                )
        except _RunAgain:
            return None
        return outcomes, events

    # -- the cluster's periodic work -----------------------------------------

    def leads(self) -> bool:
        """Whether this plane runs the cluster's periodic work (approval expiry,
        retention, anchors): the one holding an advisory lock on its own session.
        When that session ends (the plane stops or dies) another takes over."""
        with self._leader_lock:
            try:
                if self._leader is not None and not self._leader.closed:
                    self._leader.execute("SELECT 1")
                    return True
                conn = psycopg.connect(self.url, autocommit=True, application_name="warden")
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)).fetchone()
                if row is not None and row[0]:
                    self._leader = conn
                    return True
                conn.close()
            except psycopg.Error:
                if self._leader is not None:
                    self._leader.close()
                self._leader = None
            return False

    # -- reading -----------------------------------------------------------

    def _rows(self, query: str, params: Any = None) -> list[dict[str, Any]]:
        try:
            with self._pool.connection() as conn:
                return conn.execute(query, params).fetchall()
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreError(f"the store cannot be read: {_reason(exc)}") from None

    def _row(self, query: str, params: Any = None) -> dict[str, Any] | None:
        rows = self._rows(query, params)
        return rows[0] if rows else None

    def _run(self, query: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """An audit query's rows, streamed through a server-side cursor."""
        try:
            with (
                self._pool.connection() as conn,
                conn.transaction(),
                conn.cursor(name="warden_audit_read") as cursor,
            ):
                cursor.itersize = 2_000
                cursor.execute(_pg(query), params)
                yield from cursor
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreError(f"the store cannot be read: {_reason(exc)}") from None

    def get_capability(self, capability_id: str, version: str) -> CapabilityRecord | None:
        row = self._row(
            "SELECT * FROM capabilities WHERE id = %s AND version = %s", (capability_id, version)
        )
        return self._sealed.capability(row) if row else None

    def approval_transitions(
        self, after_seq: int, through_seq: int, limit: int
    ) -> list[tuple[int, str, str]]:
        rows = self._rows(
            "SELECT seq, status, approval_id FROM audit_events "
            "WHERE seq > %s AND seq <= %s AND kind = 'approval' ORDER BY seq LIMIT %s",
            (after_seq, through_seq, limit),
        )
        return [(int(r["seq"]), str(r["status"]), str(r["approval_id"])) for r in rows]

    def last_seq(self) -> int:
        row = self._row("SELECT max(seq) AS seq FROM audit_events")
        return int(row["seq"] or 0) if row else 0

    def latest_version(self, capability_id: str) -> str | None:
        row = self._row(
            "SELECT version FROM capabilities WHERE id = %s ORDER BY ordinal DESC LIMIT 1",
            (capability_id,),
        )
        return str(row["version"]) if row else None

    def latest_capabilities(
        self, namespaces: Sequence[str] | None = None
    ) -> list[CapabilityRecord]:
        if namespaces is None:
            where, params = "TRUE", list[str]()
        else:
            where, params = in_namespaces(namespaces)
        rows = self._rows(
            f"SELECT c.* FROM capabilities c WHERE ({where}) AND {LATEST} "  # noqa: S608
            "ORDER BY c.id",
            params,
        )
        return self._sealed.each(self._sealed.capability, iter(rows))

    def every_capability_version(self) -> list[CapabilityRecord]:
        rows = self._rows("SELECT * FROM capabilities ORDER BY id, ordinal")
        return self._sealed.each(self._sealed.capability, iter(rows))

    def limit_usages(
        self, limit_id: str, limit_key: str | None, now: float, limit: int = 100
    ) -> list[LimitUsage]:
        try:
            with self._pool.connection() as conn:
                if limit_key is not None:
                    return [_limit_usage(conn, limit_id, limit_key, now)]
                keys = conn.execute(
                    "SELECT limit_key FROM limit_buckets WHERE limit_id = %s AND full_at > %s "
                    "UNION SELECT limit_key FROM limit_holds WHERE limit_id = %s AND until > %s "
                    "ORDER BY limit_key LIMIT %s",
                    (limit_id, now, limit_id, now, limit),
                ).fetchall()
                return [_limit_usage(conn, limit_id, row["limit_key"], now) for row in keys]
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreError(f"the store cannot be read: {_reason(exc)}") from None

    def get_invocation(self, invocation_id: str) -> InvocationRecord | None:
        row = self._row("SELECT * FROM invocations WHERE invocation_id = %s", (invocation_id,))
        return InvocationRecord(**row) if row else None

    def replicas(self, seen_since: str) -> list[ReplicaRecord]:
        rows = self._rows(
            "SELECT * FROM replicas WHERE seen_at >= %s ORDER BY host, replica_id", (seen_since,)
        )
        return [replica_sql.record(r) for r in rows]

    def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        row = self._row("SELECT * FROM approvals WHERE approval_id = %s", (approval_id,))
        return self._sealed.approval(row) if row else None

    def get_idempotency(
        self, service: str, capability_id: str, actor_id: str, key: str
    ) -> IdempotencyRecord | None:
        row = self._row(
            "SELECT * FROM idempotency_keys WHERE service = %s AND capability_id = %s "
            "AND actor_id = %s AND key = %s",
            (service, capability_id, actor_id, key),
        )
        return self._sealed.idempotency(row) if row else None

    def idempotency_of(self, invocation_id: str) -> IdempotencyRecord | None:
        row = self._row("SELECT * FROM idempotency_keys WHERE invocation_id = %s", (invocation_id,))
        return self._sealed.idempotency(row) if row else None

    def list_approvals(
        self, tenant: str, states: Sequence[str] = (), limit: int = 100
    ) -> list[ApprovalRecord]:
        query = "SELECT * FROM approvals WHERE tenant = %s"
        params: list[Any] = [tenant]
        if states:
            query += " AND state = ANY(%s)"
            params.append(list(states))
        query += " ORDER BY created_at DESC, approval_id LIMIT %s"
        params.append(int(limit))
        return self._sealed.each(self._sealed.approval, iter(self._rows(query, params)))

    def audit_page(self, f: RecordFilter, scope: Scope, page: PageRequest) -> Page:
        return audit_sql.page(self._run, f, scope, page, POSTGRES)

    def audit_records(
        self, f: RecordFilter = EVERYTHING, scope: Scope = None, *, limit: int | None = None
    ) -> Iterator[dict[str, Any]]:
        return audit_sql.records(self._run, f, scope, POSTGRES, limit)

    def audit_newest(self) -> dict[str, Any] | None:
        return next(self._run(f"{audit_sql.SELECT_RECORDS} ORDER BY seq DESC LIMIT 1", {}), None)

    def audit_counts(
        self, column: str, f: RecordFilter = EVERYTHING, scope: Scope = None
    ) -> list[tuple[Any, int, str, str]]:
        return audit_sql.counts(self._run, column, f, scope, POSTGRES)

    def audit_checkpoint(self) -> Checkpoint | None:
        row = self._row("SELECT * FROM audit_checkpoints ORDER BY seq DESC LIMIT 1")
        return Checkpoint(**row) if row else None

    def tampered_rows(self) -> list[str]:
        found = []
        for table in SEALED_TABLES:
            query = pgsql.SQL("SELECT * FROM {}").format(pgsql.Identifier(table))
            for values in self._rows(query.as_string(None)):
                if not self._sealed.seal.holds(table, values):
                    found.append(str(TamperedRow(table, ROW_NAMES[table](values))))
        return found

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.stop()
        self._writer.join()
        self._pool.close()
        with self._leader_lock:
            if self._leader is not None:
                # Hand leadership over now: a closed session's locks are freed
                # only once the server has ended it, a moment later.
                with contextlib.suppress(psycopg.Error):
                    self._leader.execute("SELECT pg_advisory_unlock(%s)", (LEADER_LOCK,))
                self._leader.close()


LATEST: Final = "c.ordinal = (SELECT max(ordinal) FROM capabilities WHERE id = c.id)"


def in_namespaces(namespaces: Sequence[str]) -> tuple[str, list[str]]:
    """A WHERE clause over ``c.id`` for the ids in these namespaces (each a
    range of the primary key, see the SQLite store)."""
    if not namespaces:
        return "FALSE", []
    terms, params = [], []
    for namespace in namespaces:
        terms.append("c.id = %s OR (c.id > %s AND c.id < %s)")
        params += [namespace, namespace + ".", namespace + "/"]
    return " OR ".join(f"({t})" for t in terms), params
