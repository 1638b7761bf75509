"""Audit queries in SQL, for every store that speaks it: a typed filter and a
scope become a WHERE clause of fixed fragments over the audit columns, with
every value a bound (``:name``) parameter."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from warden_server.records.events import COLUMNS
from warden_server.records.query import (
    GROUPABLE,
    Page,
    PageRequest,
    RecordFilter,
    Scope,
    literal_prefix,
)

NEWEST_FIRST: Final = "ts DESC, seq DESC"
SELECT_RECORDS: Final = f"SELECT {', '.join(COLUMNS)} FROM audit_events"  # noqa: S608


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the SQL of two stores in an audit query.

    Attributes:
        glob: The condition that ``column`` matches the glob parameter ``param``.
        glob_value: The value bound for a glob pattern.
        off_index: ``column`` written so that the planner does not use its index.
    """

    glob: Callable[[str, str], str]
    glob_value: Callable[[str], str]
    off_index: Callable[[str], str]


@dataclass(slots=True)
class Where:
    """A WHERE clause assembled from fixed fragments and bound values."""

    clauses: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    def add(self, clause: str, **params: Any) -> None:
        self.clauses.append(clause)
        self.params.update(params)

    @property
    def sql(self) -> str:
        return " AND ".join(self.clauses)

    def select(self, head: str = SELECT_RECORDS) -> str:
        return head + (f" WHERE {self.sql}" if self.clauses else "")


def where(f: RecordFilter, scope: Scope, dialect: Dialect, *, globs_by_time: bool = False) -> Where:
    found = Where()
    for column, value in f.exact().items():
        found.add(f"{column} = :{column}", **{column: value})
    if f.after_seq is not None:
        found.add("seq > :after_seq", after_seq=f.after_seq)
    if f.through_seq is not None:
        found.add("seq <= :through_seq", through_seq=f.through_seq)
    if f.capabilities:
        found.add(globs(f.capabilities, found.params, dialect, by_time=globs_by_time))
    if f.since is not None:
        found.add("ts >= :since", since=f.since)
    if f.until is not None:
        found.add("ts < :until", until=f.until)
    if scope is not None:
        names = [f"scope{i}" for i in range(len(scope))]
        found.add(
            f"tenant IN ({', '.join(':' + n for n in names)})" if names else "1 = 0",
            **dict(zip(names, sorted(scope), strict=True)),
        )
    return found


def globs(
    patterns: tuple[str, ...], params: dict[str, Any], dialect: Dialect, *, by_time: bool
) -> str:
    """Any of the capability globs.

    An exact id is an equality. A glob's literal prefix bounds a range of the
    capability index, unless ``by_time``, which keeps the planner off that
    index so that newest-first reads follow the time index.
    """
    terms = []
    for i, pattern in enumerate(patterns):
        prefix = literal_prefix(pattern)
        if prefix == pattern:
            params[f"cap{i}"] = pattern
            terms.append(f"capability_id = :cap{i}")
            continue
        params[f"cap{i}"] = dialect.glob_value(pattern)
        if by_time or (after := _after(prefix)) is None:
            terms.append(dialect.glob(dialect.off_index("capability_id"), f"cap{i}"))
        else:
            params[f"cap{i}_lo"] = prefix
            params[f"cap{i}_hi"] = after
            terms.append(
                f"(capability_id >= :cap{i}_lo AND capability_id < :cap{i}_hi "
                f"AND {dialect.glob('capability_id', f'cap{i}')})"
            )
    return "(" + " OR ".join(terms) + ")"


def _after(prefix: str) -> str | None:
    """The least text above every text that starts with ``prefix`` (text
    compares as UTF-8 bytes, which is code point order); None when there is
    none (no prefix, or one of nothing but U+10FFFF)."""
    stripped = prefix.rstrip("\U0010ffff")
    if not stripped:
        return None
    following = ord(stripped[-1]) + 1
    if 0xD800 <= following <= 0xDFFF:  # surrogates are not text
        following = 0xE000
    return stripped[:-1] + chr(following)


Run = Callable[[str, dict[str, Any]], Iterator[dict[str, Any]]]
"""Runs one query with its parameters, yielding rows as column dicts."""


def page(run: Run, f: RecordFilter, scope: Scope, request: PageRequest, dialect: Dialect) -> Page:
    """Matching records newest first, one page of them."""
    by_time = bool(f.capabilities) and _globs_are_common(
        run, f.capabilities, request.limit, dialect
    )
    found = where(f, scope, dialect, globs_by_time=by_time)
    if request.before is not None:
        cursor = next(run(f"{SELECT_RECORDS} WHERE seq = :seq", {"seq": request.before}), None)
        if cursor is None:
            found.add("seq < :before", before=request.before)
        else:
            found.add(
                "(ts, seq) < (:before_ts, :before)", before_ts=cursor["ts"], before=request.before
            )
    sql = f"{found.select()} ORDER BY {NEWEST_FIRST} LIMIT {int(request.limit) + 1}"
    rows = list(run(sql, found.params))
    more = len(rows) > request.limit
    rows = rows[: request.limit]
    return Page(rows, rows[-1]["seq"] if more else None)


def _globs_are_common(run: Run, patterns: tuple[str, ...], limit: int, dialect: Dialect) -> bool:
    """Whether a page of the globs' records is cheaper to find along the time index.

    Newest first along the time index visits about ``limit * records / matches``
    records for a page; through the capability index it visits the matches and
    sorts them. The first is cheaper once ``matches ** 2 > limit * records``, so
    the matches are counted on the capability index up to that point and no further.
    """
    if all(literal_prefix(p) == p for p in patterns):
        return False
    newest = next(run("SELECT max(seq) AS seq FROM audit_events", {}), None)
    if newest is None or newest["seq"] is None:
        return False
    crossover = math.isqrt(limit * int(newest["seq"])) + 1
    found = Where()
    found.add(globs(patterns, found.params, dialect, by_time=False))
    inner = found.select("SELECT 1 FROM audit_events")
    counted = f"SELECT count(*) AS n FROM ({inner} LIMIT {crossover}) matches"  # noqa: S608
    row = next(run(counted, found.params))
    return int(row["n"]) >= crossover


def records(
    run: Run, f: RecordFilter, scope: Scope, dialect: Dialect, limit: int | None
) -> Iterator[dict[str, Any]]:
    """Matching records oldest first (in chain order)."""
    found = where(f, scope, dialect)
    tail = " ORDER BY seq" + (f" LIMIT {int(limit)}" if limit is not None else "")
    if not found.clauses or limit is not None:
        return run(found.select() + tail, found.params)
    # Select through the filter's indexes, then read in seq order: an IN list is
    # walked in ascending order, so no sort, and no full scan for a narrow filter.
    selected = f"{SELECT_RECORDS} WHERE seq IN (SELECT seq FROM audit_events WHERE {found.sql})"  # noqa: S608
    return run(selected + tail, found.params)


def counts(
    run: Run, column: str, f: RecordFilter, scope: Scope, dialect: Dialect
) -> list[tuple[Any, int, str, str]]:
    """``(value, count, first ts, last ts)`` of matching records per value of ``column``."""
    if column not in GROUPABLE:
        raise ValueError(f"audit records cannot be counted by {column!r}")
    found = where(f, scope, dialect)
    head = (
        f"SELECT {column} AS value, count(*) AS n, "  # noqa: S608 (a fixed column)
        "min(ts) AS first, max(ts) AS last FROM audit_events"
    )
    rows = run(found.select(head) + f" GROUP BY {column}", found.params)
    return [(r["value"], int(r["n"]), r["first"], r["last"]) for r in rows]
