"""The hash chain over ``audit_events`` (SI-4).

Each record's hash is SHA-256 over the previous record's hash and the
canonical JSON (RFC 8785) of every column but ``hash``; the sequence number is
inside the hashed row, so an edited, deleted, inserted or reordered record
breaks the chain at a sequence number that ``verify`` names.

Columns added after the first schema (``LATE_COLUMNS``) are hashed only when
they hold a value, so records written before a column existed still verify,
while setting or clearing the column on any record breaks its hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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
    return hashlib.sha256(canonical_json(body)).hexdigest()


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    checked: int
    first_bad_seq: int | None = None
    problem: str | None = None


def verify_rows(
    rows: Iterable[Mapping[str, Any]], start_hash: str = GENESIS, start_seq: int = 1
) -> VerifyResult:
    """Walk rows in ``seq`` order and report the first one that breaks the chain."""
    expected_prev = start_hash
    expected_seq = start_seq
    checked = 0
    for row in rows:
        seq = int(row["seq"])
        if seq != expected_seq:
            return VerifyResult(
                False,
                checked,
                expected_seq,
                f"expected seq {expected_seq}, found {seq}: records missing or reordered",
            )
        if row["prev_hash"] != expected_prev:
            return VerifyResult(False, checked, seq, "prev_hash does not match the previous record")
        if record_hash(row) != row["hash"]:
            return VerifyResult(False, checked, seq, "hash does not match the record's contents")
        expected_prev = row["hash"]
        expected_seq = seq + 1
        checked += 1
    return VerifyResult(True, checked)
