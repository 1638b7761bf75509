"""Reading the audit log: filtered queries, statistics, export and verification.

Every function takes an optional tenant ``scope``: None reads every tenant
(the store's owner, or an ``auditor:all``); a set of tenants restricts every
answer to records of those tenants (SI-13). Values always travel as bound
parameters; only fixed column names are spliced into SQL.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from warden_server.audit.chain import VerifyResult, verify_rows
from warden_server.audit.checkpoint import Checkpoint, CheckpointVerifier
from warden_server.audit.events import KINDS
from warden_server.audit.times import parse_time
from warden_server.errors import InvalidRequest, RequestError
from warden_server.store import Store

NEWEST_FIRST: Final = "ts DESC, seq DESC"
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

Scope = frozenset[str] | None
"""The tenants a reader may see; None means every tenant."""


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
class Page:
    """One page of a query, newest first.

    Attributes:
        rows: The records, as column dicts.
        next_before: Pass as ``before`` for the next (older) page; None on the last page.
    """

    rows: list[dict[str, Any]]
    next_before: int | None


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


class _Where:
    """A WHERE clause assembled from fixed fragments and bound values."""

    def __init__(self) -> None:
        self.clauses: list[str] = []
        self.params: dict[str, Any] = {}

    def add(self, clause: str, **params: Any) -> None:
        self.clauses.append(clause)
        self.params.update(params)

    @property
    def sql(self) -> str:
        return " AND ".join(self.clauses)


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


def _where(f: AuditFilter, scope: Scope, now: datetime, *, globs_by_time: bool = False) -> _Where:
    _check_bounds(f)
    where = _Where()
    exact = {
        "actor_id": f.actor,
        "tenant": f.tenant,
        "stage": f.stage,
        "code": f.code,
        "status": f.status,
        "kind": f.kind,
        "invocation_id": f.invocation,
        "seq": f.seq,
    }
    if f.kind is not None and f.kind not in KINDS:
        raise InvalidRequest(f"unknown kind {f.kind!r} (known: {', '.join(KINDS)})")
    for column, value in exact.items():
        if value is not None:
            where.add(f"{column} = :{column}", **{column: value})
    if f.capabilities:
        where.add(_globs(f.capabilities, where.params, by_time=globs_by_time))
    if f.since is not None:
        where.add("ts >= :since", since=parse_time(f.since, now, "since"))
    if f.until is not None:
        where.add("ts < :until", until=parse_time(f.until, now, "until"))
    if scope is not None:
        names = [f"scope{i}" for i in range(len(scope))]
        where.add(
            f"tenant IN ({', '.join(':' + n for n in names)})" if names else "0",
            **dict(zip(names, sorted(scope), strict=True)),
        )
    return where


def _globs(patterns: tuple[str, ...], params: dict[str, Any], *, by_time: bool) -> str:
    """Any of the capability globs.

    An exact id is an equality. A glob's literal prefix bounds a range of the
    capability index, unless ``by_time``, which keeps the planner off that
    index (the unary ``+``) so that newest-first reads follow the time index.
    """
    terms = []
    for i, pattern in enumerate(patterns):
        if not pattern:
            raise InvalidRequest("a capability pattern cannot be empty")
        params[f"cap{i}"] = pattern
        prefix = _literal_prefix(pattern)
        if prefix == pattern:
            terms.append(f"capability_id = :cap{i}")
        elif by_time or (after := _after(prefix)) is None:
            terms.append(f"+capability_id GLOB :cap{i}")
        else:
            params[f"cap{i}_lo"] = prefix
            params[f"cap{i}_hi"] = after
            terms.append(
                f"(capability_id >= :cap{i}_lo AND capability_id < :cap{i}_hi "
                f"AND capability_id GLOB :cap{i})"
            )
    return "(" + " OR ".join(terms) + ")"


def _after(prefix: str) -> str | None:
    """The least text above every text that starts with ``prefix`` (SQLite
    compares text as UTF-8 bytes, which is code point order); None when
    there is none (no prefix, or one of nothing but U+10FFFF)."""
    stripped = prefix.rstrip("\U0010ffff")
    if not stripped:
        return None
    following = ord(stripped[-1]) + 1
    if 0xD800 <= following <= 0xDFFF:  # surrogates are not text
        following = 0xE000
    return stripped[:-1] + chr(following)


def _literal_prefix(pattern: str) -> str:
    for i, char in enumerate(pattern):
        if char in "*?[":
            return pattern[:i]
    return pattern


def _globs_are_common(store: Store, patterns: tuple[str, ...], limit: int) -> bool:
    """Whether a page of the globs' records is cheaper to find along the time index.

    Newest first along the time index visits about ``limit * records / matches``
    records for a page; through the capability index it visits the matches and
    sorts them. The first is cheaper once ``matches ** 2 > limit * records``, so
    the matches are counted on the capability index up to that point and no further.
    """
    if all(_literal_prefix(p) == p for p in patterns):
        return False
    newest = next(store.audit_rows(order="seq DESC", limit=1), None)
    if newest is None:
        return False
    crossover = math.isqrt(limit * int(newest["seq"])) + 1
    where = _Where()
    where.add(_globs(patterns, where.params, by_time=False))
    return store.audit_count(where.sql, where.params, at_most=crossover) >= crossover


def query(
    store: Store,
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
    _check_bounds(f)  # before the globs are counted
    by_time = bool(f.capabilities) and _globs_are_common(store, f.capabilities, limit)
    where = _where(f, scope, now, globs_by_time=by_time)
    if before is not None:
        # Older than record ``before`` in page order. A number the log does not
        # hold (past its head, or pruned) pages by sequence number alone.
        cursor = next(store.audit_rows("seq = :seq", {"seq": before}, limit=1), None)
        if cursor is None:
            where.add("seq < :before", before=before)
        else:
            where.add("(ts, seq) < (:before_ts, :before)", before_ts=cursor["ts"], before=before)
    rows = list(store.audit_rows(where.sql, where.params, order=NEWEST_FIRST, limit=limit + 1))
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, rows[-1]["seq"] if more else None)


def export(
    store: Store, f: AuditFilter, *, now: datetime, scope: Scope = None
) -> Iterator[dict[str, Any]]:
    """Every matching record, oldest first (in chain order), without a limit."""
    where = _where(f, scope, now)
    if not where.sql:
        return store.audit_rows(order="seq")
    # Select through the filter's indexes, then read in seq order: an IN list is
    # walked in ascending order, so no sort, and no full scan for a narrow filter.
    selected = f"seq IN (SELECT seq FROM audit_events WHERE {where.sql})"  # noqa: S608
    return store.audit_rows(selected, where.params, order="seq")


def stats(store: Store, by: str, f: AuditFilter, *, now: datetime, scope: Scope = None) -> Stats:
    """Counts and rates of matching records grouped by stage, code, capability,
    actor or status, largest first.

    Raises:
        InvalidRequest: an unknown grouping, or a filter ``query`` refuses.
    """
    column = GROUPINGS.get(by)
    if column is None:
        raise InvalidRequest(f"cannot group by {by!r} (one of: {', '.join(GROUPINGS)})")
    where = _where(f, scope, now)
    counts = store.audit_counts(column, where.sql, where.params)
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


def verify(store: Store, verifier: CheckpointVerifier | None = None) -> VerifyResult:
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
    except sqlite3.DatabaseError as exc:
        return readable.verdict(exc, start_seq=1)
    start_seq = checkpoint.seq + 1 if checkpoint else 1
    rows = readable.rows(store.audit_rows(order="seq"))
    try:
        chain = _verify_chain(store, rows, checkpoint, verifier)
        if not chain.ok:
            return chain
        tampered = store.tampered_rows()
    except sqlite3.DatabaseError as exc:
        return readable.verdict(exc, start_seq=start_seq)
    if tampered:
        more = f"; and {len(tampered) - 5} more" if len(tampered) > 5 else ""
        shown = "; ".join(tampered[:5]) + more
        return VerifyResult(False, chain.checked, None, shown, chain.start_seq)
    return chain


def _verify_chain(
    store: Store,
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

    def verdict(self, exc: sqlite3.DatabaseError, *, start_seq: int) -> VerifyResult:
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
