"""The hash chain over ``audit_events`` (SI-4): how one record's hash is made.

Each record's hash is SHA-256 over the previous record's hash and the
canonical JSON (RFC 8785) of every column but ``hash``; the sequence number is
inside the hashed row. The store extends the chain with ``record_hash``;
``audit.chain`` walks it.

Columns added after the first schema (``LATE_COLUMNS``) are hashed only when
they hold a value, so records written before a column existed still verify,
while setting or clearing the column on any record breaks its hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from warden.shared.canonical import canonical_json

GENESIS: Final = "0" * 64
"""The ``prev_hash`` of the first record."""

LATE_COLUMNS: Final = frozenset({"call_id", "attempt"})
"""Columns added by later migrations: hashed only when not NULL."""


def record_hash(row: Mapping[str, Any]) -> str:
    """The hash of a row (every column but ``hash``; ``prev_hash`` included)."""
    body = {
        key: value
        for key, value in row.items()
        if key != "hash" and not (value is None and key in LATE_COLUMNS)
    }
    return hashlib.sha256(canonical_row(body)).hexdigest()


def canonical_row(body: Mapping[str, Any]) -> bytes:
    """RFC 8785 canonical JSON of a flat row (``canonical_json`` takes its fast
    path for the text, null and integer columns of a record)."""
    return canonical_json(dict(body))
