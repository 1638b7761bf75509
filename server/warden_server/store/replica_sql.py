"""The ``replicas`` table, in the SQL both stores speak: each replica's
heartbeat row, replaced whole at every report (``warden_server/replicas.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any, Final

from warden_server.store.records import ReplicaRecord

COLUMNS: Final = tuple(f.name for f in fields(ReplicaRecord))


def create_table(text: str = "TEXT") -> str:
    """The table, with ``text`` as the type of its text columns."""
    types = {"processes": "INTEGER", "registrations": "INTEGER", "leader": "INTEGER"}
    columns = ", ".join(f"{c} {types.get(c, text)}" for c in COLUMNS)
    return f"CREATE TABLE replicas ({columns}, PRIMARY KEY (replica_id))"


def upsert(mark: str) -> str:
    """Insert or replace a replica's row; ``mark`` is the driver's placeholder
    for a named parameter (``:{}`` or ``%({})s``)."""
    values = ", ".join(mark.format(c) for c in COLUMNS)
    updates = ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[1:])
    return (
        f"INSERT INTO replicas ({', '.join(COLUMNS)}) VALUES ({values}) "  # noqa: S608
        f"ON CONFLICT (replica_id) DO UPDATE SET {updates}"
    )


def row(record: ReplicaRecord) -> dict[str, Any]:
    values = asdict(record)
    values["leader"] = int(record.leader)
    return values


def record(values: Mapping[str, Any]) -> ReplicaRecord:
    data = {c: values[c] for c in COLUMNS}
    data["leader"] = bool(data["leader"])
    return ReplicaRecord(**data)
