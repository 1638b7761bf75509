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


class NotCanonicalizable(ValueError):
    """A value has no RFC 8785 form: an integer beyond ±2^53, NaN or an
    infinity, or a string with a lone surrogate."""


def canonical_json(value: JSONValue) -> bytes:
    """The RFC 8785 canonical serialization of a JSON value.

    Raises:
        NotCanonicalizable: the value has no canonical form.
    """
    try:
        return bytes(rfc8785.dumps(value))
    except rfc8785.CanonicalizationError as exc:
        raise NotCanonicalizable(str(exc)) from None


def canonical_value(value: JSONValue) -> JSONValue:
    """The value as its canonical form reads back: ``1.0`` becomes ``1``, exactly
    as the digest sees it, so policies and handlers see what was approved."""
    return json.loads(canonical_json(value))


def strict_loads(text: str | bytes) -> JSONValue:
    """Parse JSON text, refusing the NaN and Infinity literals Python would accept.

    Raises:
        ValueError: the text is not strict JSON.
    """
    return json.loads(text, parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def digest(value: JSONValue) -> str:
    """SHA-256 of the canonical form, as ``sha256:<hex>``."""
    return digest_of(canonical_json(value))


def digest_of(canonical: bytes) -> str:
    """``digest`` of a value whose canonical form is already at hand."""
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def compact_json(value: JSONValue) -> str:
    """Compact, key-sorted JSON text for storage and the wire."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
