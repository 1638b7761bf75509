"""Canonical JSON (RFC 8785) and the digests built on it.

An approver approves exactly these arguments, a grant is bound to exactly this
input, and the audit chain hashes exactly these bytes: all three rest on one
canonical form, computed here.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785

JSONValue = Any
"""A value made of dict, list, str, int, float, bool and None."""


def canonical_json(value: JSONValue) -> bytes:
    """The RFC 8785 canonical serialization of a JSON value."""
    return bytes(rfc8785.dumps(value))


def digest(value: JSONValue) -> str:
    """SHA-256 of the canonical form, as ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def compact_json(value: JSONValue) -> str:
    """Compact, key-sorted JSON text for storage and the wire."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
