"""How a reader asks the store for audit records: a typed filter, the tenants
it may see (its scope) and a page. The store turns them into its own query
language; no query text crosses the seam."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

Scope = frozenset[str] | None
"""The tenants a reader may see; None means every tenant."""

GROUPABLE: Final = ("stage", "code", "capability_id", "actor_id", "status")
"""The columns audit records can be counted by."""


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """Which audit records: every field that is set must hold; empty selects all.

    Attributes:
        capabilities: Glob patterns over capability ids (``*``, ``?``,
            ``[...]``); any may match.
        since: Inclusive, ISO 8601 as the store writes times (``records.events.iso``).
        until: Exclusive, in the same form.
        after_seq: Only records after this sequence number.
        through_seq: Only records up to and including this sequence number.
    """

    seq: int | None = None
    after_seq: int | None = None
    through_seq: int | None = None
    kind: str | None = None
    status: str | None = None
    stage: str | None = None
    code: str | None = None
    actor_id: str | None = None
    tenant: str | None = None
    invocation_id: str | None = None
    capabilities: tuple[str, ...] = ()
    since: str | None = None
    until: str | None = None

    def exact(self) -> dict[str, Any]:
        """The columns that must equal a value, and the values."""
        columns = {
            "seq": self.seq,
            "kind": self.kind,
            "status": self.status,
            "stage": self.stage,
            "code": self.code,
            "actor_id": self.actor_id,
            "tenant": self.tenant,
            "invocation_id": self.invocation_id,
        }
        return {column: value for column, value in columns.items() if value is not None}


EVERYTHING: Final = RecordFilter()


@dataclass(frozen=True, slots=True)
class PageRequest:
    """One page, newest first (``ts`` then ``seq``, descending).

    Attributes:
        before: The ``next_before`` of the previous page: continue with the
            records older than that one in page order (a number the log does
            not hold pages by sequence number alone).
    """

    limit: int
    before: int | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of audit records, newest first.

    Attributes:
        rows: The records, as column dicts.
        next_before: Pass as ``before`` for the next (older) page; None on the last page.
    """

    rows: list[dict[str, Any]]
    next_before: int | None


def literal_prefix(pattern: str) -> str:
    """The part of a glob before its first wildcard."""
    for i, char in enumerate(pattern):
        if char in "*?[":
            return pattern[:i]
    return pattern
