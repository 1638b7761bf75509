"""Persistence behind interfaces of their own: the registry, invocations
(grants), approvals, idempotency keys and the audit log (writing and
queries). The only package that speaks SQL."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from warden_server.store.base import (
    AuditQueries,
    Store,
    StoreError,
    StoreObserver,
    StoreUnreadable,
    WriteTransaction,
)
from warden_server.store.records import (
    ApprovalRecord,
    CapabilityRecord,
    IdempotencyRecord,
    InvocationRecord,
    LimitHold,
    LimitUsage,
)
from warden_server.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from warden_server.store.postgres import PostgresStore


def open_store(
    url: str | None, path: Path, *, observer: StoreObserver | None = None
) -> SQLiteStore | PostgresStore:
    """The PostgreSQL store at ``url`` (its key files based at ``path``), or
    the SQLite store file at ``path`` when there is no URL.

    Raises:
        StoreError: the store cannot be opened.
    """
    if url is not None:
        from warden_server.store.postgres import PostgresStore

        return PostgresStore(url, key_base=path, observer=observer)
    return SQLiteStore(path, observer=observer)


__all__ = [
    "ApprovalRecord",
    "AuditQueries",
    "CapabilityRecord",
    "IdempotencyRecord",
    "InvocationRecord",
    "LimitHold",
    "LimitUsage",
    "SQLiteStore",
    "Store",
    "StoreError",
    "StoreUnreadable",
    "WriteTransaction",
    "open_store",
]
