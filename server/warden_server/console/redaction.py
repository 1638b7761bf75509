"""An approval's arguments as rows a person reads: one per leaf value, with
the values the plane redacted (SI-5) marked as such rather than shown as
if they were the data."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MASK = "[REDACTED]"
KEYED_HASH = "hmac-sha256:"


@dataclass(frozen=True, slots=True)
class Field:
    path: str
    """A JSON Pointer into the arguments, e.g. /card/number."""
    value: str
    """The value as JSON text; for a redacted one, what the store holds."""
    redacted: bool


def fields_of(value: Any, path: str = "") -> list[Field]:
    """Every leaf of ``value``, in document order."""
    if isinstance(value, dict):
        if not value:
            return [Field(path or "/", "{}", False)]
        return [
            f for key, item in value.items() for f in fields_of(item, f"{path}/{_escape(str(key))}")
        ]
    if isinstance(value, list):
        if not value:
            return [Field(path or "/", "[]", False)]
        return [f for i, item in enumerate(value) for f in fields_of(item, f"{path}/{i}")]
    redacted = isinstance(value, str) and (value == MASK or value.startswith(KEYED_HASH))
    return [Field(path or "/", json.dumps(value, ensure_ascii=False), redacted)]


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
