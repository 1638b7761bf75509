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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from warden_server.records.chain import GENESIS, record_hash


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """What a walk of the chain found.

    Attributes:
        ok: Every record links to the one before and matches its hash.
        checked: Records verified before the first bad one (all, when ok).
        first_bad_seq: The first sequence number that is not what was written.
        problem: What is wrong there, in words.
        start_seq: Where the walk began (1, or after a retention checkpoint).
        unreadable: The store file itself is corrupt: SQLite could not read
            it past ``first_bad_seq`` (a verdict of its own, not a tampered record).
    """

    ok: bool
    checked: int
    first_bad_seq: int | None = None
    problem: str | None = None
    start_seq: int = 1
    unreadable: bool = False


def verify_rows(
    rows: Iterable[Mapping[str, Any]], start_hash: str = GENESIS, start_seq: int = 1
) -> VerifyResult:
    """Walk rows in ``seq`` order and name the first record that is not as written.

    A record whose own hash still matches but whose link to the previous one
    is broken proves the *previous* record was replaced (edited and re-hashed,
    or inserted); a record whose hash matches only under a neighbouring
    sequence number was renumbered to hide an insertion or a deletion.
    """
    expected_prev = start_hash
    expected_seq = start_seq
    checked = 0

    def bad(seq: int, problem: str) -> VerifyResult:
        # Every record before the bad one was verified.
        return VerifyResult(False, max(seq - start_seq, 0), seq, problem, start_seq)

    for row in rows:
        try:
            seq = int(row["seq"])
            record_hash(row)
        except (KeyError, TypeError, ValueError) as exc:
            # A value no record can hold (a damaged page read back as another type).
            return bad(expected_seq, f"the record after seq {expected_seq - 1} is malformed: {exc}")
        if seq != expected_seq:
            if seq < expected_seq:
                return bad(seq, f"seq {seq} appears out of order after seq {expected_seq - 1}")
            return bad(expected_seq, f"records {expected_seq}..{seq - 1} are missing")
        linked = row["prev_hash"] == expected_prev
        intact = record_hash(row) == row["hash"]
        if not intact and linked:
            return bad(seq, "the record was edited: its hash does not match its contents")
        if not intact:
            if _hashes_as(row, seq - 1):
                return bad(
                    seq - 1,
                    f"a record was inserted at seq {seq - 1}: the records after it were renumbered",
                )
            if _hashes_as(row, seq + 1):
                return bad(
                    seq,
                    f"seq {seq} holds the record written as seq {seq + 1}: a record was "
                    "deleted here and later ones renumbered, or records were reordered",
                )
            return bad(seq, "the record was edited or moved: neither its hash nor its link match")
        if not linked:
            if seq == start_seq:
                where = "the genesis hash" if start_seq == 1 else "the retention checkpoint"
                return bad(seq, f"the record does not link to {where}")
            return bad(
                seq - 1,
                f"seq {seq} does not link to it: it was edited and re-hashed, or inserted",
            )
        expected_prev = row["hash"]
        expected_seq = seq + 1
        checked += 1
    return VerifyResult(True, checked, start_seq=start_seq)


def _hashes_as(row: Mapping[str, Any], seq: int) -> bool:
    """Whether the row's stored hash is the one it would have at ``seq``."""
    return bool(record_hash({**row, "seq": seq}) == row["hash"])
