"""Reading the audit log: filtered queries, statistics, export and verification.

Every function takes an optional tenant ``scope``: None reads every tenant
(the store's owner, or an ``auditor:all``); a set of tenants restricts every
answer to records of those tenants (SI-13). Values always travel as bound
parameters; the store turns the typed filter into its own query.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from warden_server.audit.chain import VerifyResult, verify_rows
from warden_server.audit.checkpoint import CheckpointVerifier
from warden_server.audit.times import parse_time
from warden_server.errors import InvalidRequest, RequestError
from warden_server.records.checkpoint import Checkpoint
from warden_server.records.events import KINDS
from warden_server.records.query import Page, PageRequest, RecordFilter, Scope
from warden_server.store import AuditQueries, StoreUnreadable

MAX_LIMIT: Final = 10_000
MAX_PATTERNS: Final = 32
"""Capability patterns one filter may hold."""
MAX_FILTER_TEXT: Final = 256
"""Characters in any one text field of a filter (a pattern, an actor, a time)."""
GROUPINGS: Final = {
    "stage": "stage",
    "code": "code",
    "capability": "capability_id",
    "actor": "actor_id",
    "status": "status",
}
"""``stats --by`` names and the column each groups by."""


class CheckpointUnverifiable(RequestError):
    """The store was pruned, and no key was given to check its checkpoint."""


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """What to select. Empty fields select everything.

    Attributes:
        since: Inclusive: ISO 8601 (``2026-01-02``, ``2026-01-02T03:04:05Z``)
            or a duration back from now (``15m``, ``1h``, ``7d``).
        until: Exclusive, in the same forms.
        capabilities: Glob patterns over capability ids (``orders.*``); any may match.
    """

    since: str | None = None
    until: str | None = None
    capabilities: tuple[str, ...] = ()
    actor: str | None = None
    tenant: str | None = None
    stage: str | None = None
    code: str | None = None
    status: str | None = None
    kind: str | None = None
    invocation: str | None = None
    seq: int | None = None
    """One record by its sequence number (``verify --anchor`` looks anchors up so)."""

    def to_json(self) -> dict[str, Any]:
        """The filter's set fields, for the access record of an audit read."""
        fields = {
            "since": self.since,
            "until": self.until,
            "capabilities": list(self.capabilities) or None,
            "actor": self.actor,
            "tenant": self.tenant,
            "stage": self.stage,
            "code": self.code,
            "status": self.status,
            "kind": self.kind,
            "invocation": self.invocation,
            "seq": self.seq,
        }
        return {key: value for key, value in fields.items() if value is not None}


@dataclass(frozen=True, slots=True)
class StatsRow:
    key: str | None
    count: int
    share: float
    """This group's fraction of all matching records."""
    per_minute: float | None
    """Records per minute over the window; None for an empty window."""


@dataclass(frozen=True, slots=True)
class Stats:
    by: str
    total: int
    window_seconds: float
    """``since`` to ``until`` (or now); without ``since``, first to last matching record."""
    rows: list[StatsRow]


def _check_bounds(f: AuditFilter) -> None:
    """Refuse a filter beyond the limits before any of it is used."""
    if len(f.capabilities) > MAX_PATTERNS:
        raise InvalidRequest(
            f"{len(f.capabilities)} capability patterns; a filter holds at most {MAX_PATTERNS}"
        )
    texts = [
        ("since", f.since),
        ("until", f.until),
        ("actor", f.actor),
        ("tenant", f.tenant),
        ("stage", f.stage),
        ("code", f.code),
        ("status", f.status),
        ("kind", f.kind),
        ("invocation", f.invocation),
        *(("a capability pattern", p) for p in f.capabilities),
    ]
    for name, text in texts:
        if text is not None and len(text) > MAX_FILTER_TEXT:
            raise InvalidRequest(f"{name} is longer than {MAX_FILTER_TEXT} characters")


def _selection(f: AuditFilter, now: datetime) -> RecordFilter:
    """The filter as the store selects by it: checked, its times resolved."""
    _check_bounds(f)
    if f.kind is not None and f.kind not in KINDS:
        raise InvalidRequest(f"unknown kind {f.kind!r} (known: {', '.join(KINDS)})")
    if any(not pattern for pattern in f.capabilities):
        raise InvalidRequest("a capability pattern cannot be empty")
    since = None if f.since is None else parse_time(f.since, now, "since")
    until = None if f.until is None else parse_time(f.until, now, "until")
    if since is not None and until is not None and since >= until:
        raise InvalidRequest(
            f"since {f.since!r} ({since}) is not before until {f.until!r} ({until}): "
            "the window holds no time"
        )
    return RecordFilter(
        seq=f.seq,
        kind=f.kind,
        status=f.status,
        stage=f.stage,
        code=f.code,
        actor_id=f.actor,
        tenant=f.tenant,
        invocation_id=f.invocation,
        capabilities=f.capabilities,
        since=since,
        until=until,
    )


def query(
    store: AuditQueries,
    f: AuditFilter,
    *,
    now: datetime,
    scope: Scope = None,
    limit: int = 100,
    before: int | None = None,
) -> Page:
    """Matching records, newest first, ``limit`` at a time.

    Args:
        before: The ``next_before`` of the previous page: continue with the records
            older than that one (any sequence number: past the head reads from the newest).

    Raises:
        InvalidRequest: an unreadable time, an unknown kind or a bad limit.
    """
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {MAX_LIMIT}")
    return store.audit_page(_selection(f, now), scope, PageRequest(limit, before))


def export(
    store: AuditQueries, f: AuditFilter, *, now: datetime, scope: Scope = None
) -> Iterator[dict[str, Any]]:
    """Every matching record, oldest first (in chain order), without a limit."""
    return store.audit_records(_selection(f, now), scope)


def stats(
    store: AuditQueries, by: str, f: AuditFilter, *, now: datetime, scope: Scope = None
) -> Stats:
    """Counts and rates of matching records grouped by stage, code, capability,
    actor or status, largest first.

    Raises:
        InvalidRequest: an unknown grouping, or a filter ``query`` refuses.
    """
    column = GROUPINGS.get(by)
    if column is None:
        raise InvalidRequest(f"cannot group by {by!r} (one of: {', '.join(GROUPINGS)})")
    counts = store.audit_counts(column, _selection(f, now), scope)
    total = sum(count for _, count, _, _ in counts)
    if f.since is not None:
        start = _moment(parse_time(f.since, now, "since"))
        end = _moment(parse_time(f.until, now, "until")) if f.until else now
    elif counts:
        start = _moment(min(first for _, _, first, _ in counts))
        end = _moment(max(last for _, _, _, last in counts))
    else:
        start = end = now
    window = max((end - start).total_seconds(), 0.0)
    rows = [
        StatsRow(
            key=None if key is None else str(key),
            count=count,
            share=count / total,
            per_minute=count * 60 / window if window > 0 else None,
        )
        for key, count, _, _ in counts
    ]
    rows.sort(key=lambda r: (-r.count, r.key or ""))
    return Stats(by=by, total=total, window_seconds=window, rows=rows)


def verify(store: AuditQueries, verifier: CheckpointVerifier | None = None) -> VerifyResult:
    """Walk the chain and name the first bad sequence number (SI-4).

    After pruning, the walk starts at the newest retention checkpoint, whose
    signature must hold under ``verifier``. A store file SQLite cannot read
    (a damaged page) is a verdict too: ``unreadable``, naming the first record
    that could not be read.

    Raises:
        CheckpointUnverifiable: there is a checkpoint but no key to check it.
    """
    readable = _Readable()
    try:
        checkpoint = store.audit_checkpoint()
    except StoreUnreadable as exc:
        return readable.verdict(exc, start_seq=1)
    start_seq = checkpoint.seq + 1 if checkpoint else 1
    rows = readable.rows(store.audit_records())
    try:
        chain = _verify_chain(store, rows, checkpoint, verifier)
        if not chain.ok:
            return chain
        tampered = store.tampered_rows()
    except StoreUnreadable as exc:
        return readable.verdict(exc, start_seq=start_seq)
    if tampered:
        more = f"; and {len(tampered) - 5} more" if len(tampered) > 5 else ""
        shown = "; ".join(tampered[:5]) + more
        return VerifyResult(False, chain.checked, None, shown, chain.start_seq)
    return chain


def _verify_chain(
    store: AuditQueries,
    rows: Iterator[dict[str, Any]],
    checkpoint: Checkpoint | None,
    verifier: CheckpointVerifier | None,
) -> VerifyResult:
    if checkpoint is None:
        return verify_rows(rows)
    if verifier is None:
        raise CheckpointUnverifiable(
            f"the log was pruned through seq {checkpoint.seq}; checking its signed "
            "checkpoint needs the plane's checkpoint key ([audit] checkpoint_key_file, "
            "or --public-key)"
        )
    if not verifier.check(checkpoint):
        return VerifyResult(
            False,
            0,
            checkpoint.seq,
            f"the retention checkpoint at seq {checkpoint.seq} is not signed by key "
            f"{verifier.key_id} (signed as {checkpoint.key_id})",
            checkpoint.seq + 1,
        )
    return verify_rows(rows, checkpoint.hash, checkpoint.seq + 1)


class _Readable:
    """Follows a walk over the rows, to name where the file stopped being readable."""

    def __init__(self) -> None:
        self.last_seq: int | None = None

    def rows(self, rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for row in rows:
            seq = row.get("seq")
            self.last_seq = seq if isinstance(seq, int) else self.last_seq
            yield row

    def verdict(self, exc: StoreUnreadable, *, start_seq: int) -> VerifyResult:
        after = self.last_seq
        first = after + 1 if after is not None else start_seq
        where = f"after seq {after}" if after is not None else "before its first record"
        return VerifyResult(
            False,
            max(first - start_seq, 0),
            first,
            f"the store file is corrupt: SQLite cannot read it {where} ({plain(str(exc))})",
            start_seq,
            unreadable=True,
        )


def plain(text: str, limit: int = 200) -> str:
    """``text`` as one printable line of at most ``limit`` characters: a message
    from a damaged file may quote its bytes."""
    printable = "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))
    return printable if len(printable) <= limit else printable[:limit] + "..."


def _moment(iso: str) -> datetime:
    return datetime.fromisoformat(iso)
