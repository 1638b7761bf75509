"""Rows of the tables that decide, sealed as they are written and checked as
they are read (see ``integrity.py``): shared by every store."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields
from typing import Any, TypeVar

from warden_server.store.integrity import RowSeal, TamperedRow
from warden_server.store.records import ApprovalRecord, CapabilityRecord, IdempotencyRecord

T = TypeVar("T")


def row_values(record: Any) -> dict[str, Any]:
    """A record's fields as named parameters (a shallow ``asdict``: records hold
    only flat values, and this runs for every grant)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


ROW_NAMES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "capabilities": lambda row: f"{row['id']}@{row['version']}",
    "approvals": lambda row: str(row["approval_id"]),
    "idempotency_keys": lambda row: f"held by invocation {row['invocation_id']}",
}
"""How a report names a row of each sealed table."""


class Sealed:
    """Seals rows as they are written and opens them, checked, as they are read."""

    def __init__(self, seal: RowSeal, report: Callable[[TamperedRow], None]) -> None:
        self.seal = seal
        self._report = report

    def sealed(self, table: str, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` with their MAC, to write."""
        row = dict(values)
        row["mac"] = self.seal.mac(table, row)
        return row

    def opened(self, table: str, row: Mapping[str, Any]) -> dict[str, Any]:
        """A row's values without its MAC, once the MAC holds.

        Raises:
            TamperedRow: it does not (the row is reported, not used).
        """
        values = dict(row)
        if not self.seal.holds(table, values):
            error = TamperedRow(table, ROW_NAMES[table](values))
            self._report(error)
            raise error
        values.pop("mac", None)
        return values

    def capability(self, row: Mapping[str, Any]) -> CapabilityRecord:
        return capability_record(self.opened("capabilities", row))

    def approval(self, row: Mapping[str, Any]) -> ApprovalRecord:
        return ApprovalRecord(**self.opened("approvals", row))

    def idempotency(self, row: Mapping[str, Any]) -> IdempotencyRecord:
        return idempotency_record(self.opened("idempotency_keys", row))

    def each(self, open_row: Callable[[Any], T], rows: Iterator[Any]) -> list[T]:
        """Every row that opens; a tampered one is left out (and reported)."""
        opened = []
        for row in rows:
            try:
                opened.append(open_row(row))
            except TamperedRow:
                continue
        return opened


def capability_record(row: Mapping[str, Any]) -> CapabilityRecord:
    return CapabilityRecord(
        id=row["id"],
        version=row["version"],
        service=row["service"],
        digest=row["digest"],
        definition=json.loads(row["definition"]),
        registered_at=row["registered_at"],
    )


def idempotency_record(row: Mapping[str, Any]) -> IdempotencyRecord:
    values = dict(row)
    executed = values.pop("executed_before_failure")
    return IdempotencyRecord(
        **values, executed_before_failure=None if executed is None else bool(executed)
    )
