"""Integrity of the rows that decide: the registry, approvals and idempotency keys.

The audit chain covers ``audit_events``; these tables are read to decide (a
capability's schema validates input, an approval's state grants, a key's
recorded outcome replays) and change in place, so they carry a MAC instead:
HMAC-SHA256 under the store's integrity key, over the table name and every
column of the row that is not NULL. The plane writes the MAC with every write
and checks it before it uses a row; a row edited outside the plane (a schema's
``maxLength`` raised with a SQLite shell) fails the check, is refused, never
enforced, and is reported in the log and the audit log. ``warden audit verify``
checks every row too.

The key is 32 random bytes in a file beside the store (``<store>.integrity-key``,
mode 0600), created once, atomically, by whichever process opens the store
first, so every process of a plane and every command agree on it. Whoever
holds the key can forge rows: keep it with the same care as the store, and
move it with the store. A MAC cannot show a deleted row; the audit log records
every registration and approval transition.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from warden.shared.canonical import canonical_json
from warden_server.keyfiles import KeyFileError, hex_key
from warden_server.store.base import StoreError

SEALED_TABLES: Final = ("capabilities", "approvals", "idempotency_keys")
"""The tables whose rows carry a MAC, in the ``mac`` column."""
KEY_SUFFIX: Final = ".integrity-key"
KEY_BYTES: Final = 32


class TamperedRow(StoreError):
    """A row failed its integrity check: it was changed outside the plane."""

    def __init__(self, table: str, key: str) -> None:
        super().__init__(
            f"{table} row {key} fails its integrity check: it was changed outside the plane"
        )
        self.table = table
        self.key = key


class IntegrityKeyMissing(StoreError):
    """The store has sealed rows but its integrity key is not beside it."""


class RowSeal:
    """Computes and checks the MACs of sealed rows."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def beside(cls, store_path: Path, *, create: bool) -> RowSeal:
        """The key beside ``store_path``, created when it does not exist and ``create``.

        Raises:
            IntegrityKeyMissing: there is no key and ``create`` is False.
            StoreError: the key file cannot be read or written, or is not a key.
        """
        path = key_path(store_path)
        try:
            key = hex_key(path, create=create, size=KEY_BYTES)
        except KeyFileError as exc:
            raise StoreError(f"integrity key {exc}") from None
        if key is None:
            raise IntegrityKeyMissing(
                f"{store_path} has rows sealed with an integrity key, but {path} is "
                "missing: restore it beside the store (without it no row can be trusted)"
            )
        return cls(key)

    def mac(self, table: str, row: Mapping[str, Any]) -> str:
        """The MAC of a row: every column but ``mac`` that is not NULL."""
        body = {name: _plain(value) for name, value in row.items() if name != "mac"}
        message = canonical_json(
            {"table": table, "row": {k: v for k, v in body.items() if v is not None}}
        )
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def holds(self, table: str, row: Mapping[str, Any]) -> bool:
        """Whether a stored row (with its ``mac`` column) is as the plane wrote it."""
        mac = row.get("mac")
        return isinstance(mac, str) and hmac.compare_digest(mac, self.mac(table, row))

    def check(self, table: str, row: Mapping[str, Any], key: str) -> None:
        """Raises ``TamperedRow`` unless the row is as the plane wrote it."""
        if not self.holds(table, row):
            raise TamperedRow(table, key)


def key_path(store_path: Path) -> Path:
    return store_path.with_name(store_path.name + KEY_SUFFIX)


def _plain(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, bytes | memoryview):
        return "b64:" + base64.b64encode(bytes(value)).decode("ascii")
    return value
