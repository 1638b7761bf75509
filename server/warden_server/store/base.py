"""The store's interfaces, one per concern: audit writing and audit queries,
the registry, invocations, approvals and idempotency keys. A write
transaction offers every concern's writes, so that what one request writes
commits together; readers depend on the interface of their concern only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from warden_server.records.checkpoint import Checkpoint
from warden_server.records.events import AuditEvent
from warden_server.records.query import EVERYTHING, Page, PageRequest, RecordFilter, Scope
from warden_server.store.records import (
    ApprovalRecord,
    CapabilityRecord,
    IdempotencyRecord,
    InvocationRecord,
    LimitHold,
    LimitUsage,
    ReplicaRecord,
)

T = TypeVar("T")


def outcomes(futures: Sequence[Future[T]]) -> list[T | BaseException]:
    """Each future's result, or the exception it ended with, in order, once all are done."""
    done: list[T | BaseException] = []
    for future in futures:
        failure = future.exception()
        done.append(future.result() if failure is None else failure)
    return done


class StoreError(Exception):
    """The store could not do what was asked (I/O, a full disk, a closed store)."""


class StoreUnreadable(StoreError):
    """The store's data cannot be read back: a damaged file or page."""


# -- writing, inside one transaction ---------------------------------------


class AuditWriter(Protocol):
    """Appends to the audit log's hash chain, and prunes it."""

    def append_audit(self, event: AuditEvent) -> int:
        """Append an audit record; returns its sequence number."""
        ...

    def audit_hash(self, seq: int) -> str | None:
        """The hash of audit record ``seq``, or None if there is none."""
        ...

    def last_policy_event(self) -> tuple[str, str | None] | None:
        """The status and revision of the newest ``policy`` record, if any."""
        ...

    def prune_audit(self, checkpoint: Checkpoint) -> int:
        """Delete audit records up to ``checkpoint.seq`` and make it the chain's
        starting point (replacing older checkpoints); returns how many were deleted."""
        ...


class RegistryWrites(Protocol):
    def capability_versions(self, capability_id: str) -> list[CapabilityRecord]:
        """Every version of a capability, oldest first, as this transaction sees it."""
        ...

    def registry_size(self, namespaces: Sequence[str]) -> tuple[int, int]:
        """How many capabilities these namespaces hold, and the bytes of their
        latest definitions together, as this transaction sees them."""
        ...

    def insert_capability(self, record: CapabilityRecord) -> None: ...


class InvocationWrites(Protocol):
    def claim_invocation(self, invocation_id: str) -> bool:
        """Make ``invocation_id`` decided; False when a decision already claimed it."""
        ...

    def insert_invocation(self, record: InvocationRecord) -> None: ...

    def complete_invocation(
        self, invocation_id: str, completed_at: str, *, outcome_seq: int, report_digest: str
    ) -> bool:
        """Mark a granted invocation completed by the report with this digest,
        its outcome in record ``outcome_seq``; False if it was not ``granted``."""
        ...


class ApprovalWrites(Protocol):
    def insert_approval(self, record: ApprovalRecord) -> None: ...

    def consume_approval(
        self, approval_id: str, consumed_at: str, *, pending_too: bool = False
    ) -> bool:
        """Move an approval from ``approved`` (or, with ``pending_too``, from
        ``pending``) to ``consumed``; False if it was in neither state or had
        expired by ``consumed_at``."""
        ...

    def decide_approval(
        self, approval_id: str, state: str, decided_by: str, reason: str | None, decided_at: str
    ) -> bool:
        """Move an approval from ``pending`` to ``state`` (``approved`` or ``denied``);
        False if it was not pending or had expired by ``decided_at``."""
        ...

    def expire_approval(self, approval_id: str, now: str) -> bool:
        """Move a ``pending`` or ``approved`` approval whose time is up to ``expired``;
        False if it was in another state or not yet due."""
        ...

    def due_approvals(self, now: str, limit: int) -> list[ApprovalRecord]:
        """Up to ``limit`` pending or approved approvals whose time is up, oldest first."""
        ...


class IdempotencyWrites(Protocol):
    def reserve_idempotency(self, record: IdempotencyRecord, now: str) -> bool:
        """Reserve a key unless a reservation that has not expired by ``now``
        holds it; False if one does. Expired reservations are purged."""
        ...

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
        """Record the outcome of the invocation holding a reservation, for replay."""
        ...

    def release_idempotency(self, invocation_id: str) -> None:
        """Drop the reservation an invocation holds, so that a repeat runs afresh."""
        ...


class ReplicaWrites(Protocol):
    def report_replica(self, record: ReplicaRecord, *, forget_before: str) -> None:
        """Replace a replica's row with ``record``, and delete the rows of
        replicas last seen before ``forget_before``."""
        ...

    def forget_replica(self, replica_id: str) -> None:
        """Delete a replica's row (it stopped)."""
        ...


class LimitWrites(Protocol):
    """The counters of policy limits (``limits.py``), read and written in the
    transaction of the decision they admit, so processes never over-admit."""

    def limit_usage(self, limit_id: str, limit_key: str, now: float) -> LimitUsage:
        """One key's bucket and live holds (``until`` after ``now``) as this
        transaction sees them; holds that ended are purged."""
        ...

    def set_limit_bucket(self, limit_id: str, limit_key: str, full_at: float) -> None:
        """Record when a rate limit's bucket for a key is full again."""
        ...

    def hold_limit(self, hold: LimitHold) -> None: ...

    def release_limit_holds(self, invocation_id: str, kinds: Sequence[str]) -> None:
        """Give back the holds of these kinds that an invocation took."""
        ...


class WriteTransaction(
    AuditWriter,
    RegistryWrites,
    InvocationWrites,
    ApprovalWrites,
    IdempotencyWrites,
    ReplicaWrites,
    LimitWrites,
    Protocol,
):
    """Writes that commit together. Audit events appended here are durable
    when ``Store.transact`` returns, and are undone if the work raises."""


class StoreObserver(Protocol):
    """Told about every committed batch (metrics and logs; never sensitive data)."""

    def committed(self, transactions: int, events: Sequence[AuditEvent], seconds: float) -> None:
        """A batch of ``transactions`` committed with these audit events in ``seconds``."""
        ...


# -- reading ---------------------------------------------------------------


class AuditQueries(Protocol):
    """The reader side of the audit log: typed filters, never query text."""

    def audit_page(self, f: RecordFilter, scope: Scope, page: PageRequest) -> Page:
        """Matching records newest first (``ts``, then ``seq``), one page."""
        ...

    def audit_records(
        self, f: RecordFilter = EVERYTHING, scope: Scope = None, *, limit: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Matching records as column dicts, oldest first (in chain order).

        Raises:
            StoreUnreadable: the records cannot be read back (also while iterating).
        """
        ...

    def audit_newest(self) -> dict[str, Any] | None:
        """The newest record, or None when the log holds none."""
        ...

    def audit_counts(
        self, column: str, f: RecordFilter = EVERYTHING, scope: Scope = None
    ) -> list[tuple[Any, int, str, str]]:
        """``(value, count, first ts, last ts)`` of matching records per value of
        ``column`` (one of ``records.query.GROUPABLE``)."""
        ...

    def last_seq(self) -> int:
        """The sequence number of the newest audit record (0 when there is none)."""
        ...

    def audit_checkpoint(self) -> Checkpoint | None:
        """The newest retention checkpoint, or None if nothing was ever pruned."""
        ...

    def tampered_rows(self) -> list[str]:
        """Every row of the registry, approvals and idempotency keys whose
        integrity check fails, described (see ``store/integrity.py``)."""
        ...


class RegistryReads(Protocol):
    def get_capability(self, capability_id: str, version: str) -> CapabilityRecord | None: ...

    def latest_version(self, capability_id: str) -> str | None:
        """The newest registered version of a capability, or None."""
        ...

    def latest_capabilities(
        self, namespaces: Sequence[str] | None = None
    ) -> list[CapabilityRecord]:
        """The newest version of every capability, by id; only those in
        ``namespaces`` unless it is None."""
        ...

    def every_capability_version(self) -> list[CapabilityRecord]:
        """Every version of every capability, by id and each id's oldest
        first, in one read; a row that fails its integrity check is left out
        (and reported)."""
        ...


class ApprovalReads(Protocol):
    def get_approval(self, approval_id: str) -> ApprovalRecord | None: ...

    def list_approvals(
        self, tenant: str, states: Sequence[str] = (), limit: int = 100
    ) -> list[ApprovalRecord]:
        """A tenant's approvals, newest first; only those in ``states`` unless empty."""
        ...

    def approval_transitions(
        self, after_seq: int, through_seq: int, limit: int
    ) -> list[tuple[int, str, str]]:
        """``(seq, transition, approval_id)`` of the approval records after
        ``after_seq`` up to ``through_seq``, oldest first: how a plane hears of
        other processes' approval changes. Bounded on both sides, so that a
        poll reads only the records committed since the last one."""
        ...


class IdempotencyReads(Protocol):
    def get_idempotency(
        self, service: str, capability_id: str, actor_id: str, key: str
    ) -> IdempotencyRecord | None: ...

    def idempotency_of(self, invocation_id: str) -> IdempotencyRecord | None:
        """The reservation an invocation holds, if any."""
        ...


class ReplicaReads(Protocol):
    def replicas(self, seen_since: str) -> list[ReplicaRecord]:
        """The replicas that reported at ``seen_since`` or later, by host and id."""
        ...


class LimitReads(Protocol):
    def limit_usages(
        self, limit_id: str, limit_key: str | None, now: float, limit: int = 100
    ) -> list[LimitUsage]:
        """Up to ``limit`` keys' state under a limit (one key's when given),
        by key; only live holds (``until`` after ``now``)."""
        ...


class Store(
    AuditQueries,
    RegistryReads,
    ApprovalReads,
    IdempotencyReads,
    ReplicaReads,
    LimitReads,
    Protocol,
):
    """Everything the plane persists."""

    def transact(
        self, work: Callable[[WriteTransaction], T], *, deadline: float | None = None
    ) -> T:
        """Run ``work`` in a write transaction and return once it is durable.

        Concurrent callers' transactions may be committed together (group
        commit); each one's work is isolated, so one failing undoes only itself.
        Work that has not started by ``deadline`` (``time.monotonic()``) never
        runs: ``StoreError`` is raised instead.
        """
        ...

    async def atransact(
        self, work: Callable[[WriteTransaction], T], *, deadline: float | None = None
    ) -> T:
        """``transact`` for a coroutine: the same transaction, awaited on the
        caller's event loop instead of blocking it."""
        ...

    def transact_each(
        self, works: Sequence[Callable[[WriteTransaction], T]], *, deadline: float | None = None
    ) -> list[T | BaseException]:
        """Run each of ``works`` in a write transaction of its own, all handed to
        the writer at once so that they commit together, and return once they are
        durable: each one's result, or the exception it raised, in order.

        Each work is isolated as in ``transact``: one failing undoes only itself.
        A work that has not started by ``deadline`` never runs and answers
        ``StoreError``; so does every work when the store cannot commit.
        """
        ...

    def get_invocation(self, invocation_id: str) -> InvocationRecord | None: ...

    def leads(self) -> bool:
        """Whether this plane runs the periodic work done once for every plane
        on the store (approval expiry, retention, anchors); asked before each run."""
        ...

    def commit_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Let the server's event loop commit, when the store can do it there
        without blocking the loop on the network (the embedded store can)."""
        ...

    def close(self) -> None: ...
