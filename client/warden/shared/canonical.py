"""Canonical JSON (RFC 8785) and the digests built on it.

An approver approves exactly these arguments, a grant is bound to exactly this
input, and the audit chain hashes exactly these bytes: all three rest on one
canonical form, computed here.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

import rfc8785

JSONValue = Any
"""A value made of dict, list, str, int, float, bool and None."""


class NotCanonicalizable(ValueError):
    """A value has no RFC 8785 form: an integer beyond ±2^53, NaN or an
    infinity, or a string with a lone surrogate."""


_SAFE_INTEGER: Final = 2**53 - 1


def canonical_json(value: JSONValue) -> bytes:
    """The RFC 8785 canonical serialization of a JSON value.

    A value of objects with ASCII keys, arrays, text, null, booleans and
    integers within ±2^53 is written by ``json.dumps`` with sorted keys in
    exactly the RFC 8785 form (property tests hold the two to the same bytes),
    several times faster than the general encoder; it runs for every input,
    digest and audit record. Anything else (a number with a fraction, a key
    beyond ASCII, whose RFC 8785 order is by UTF-16 code units) takes the
    general encoder.

    Raises:
        NotCanonicalizable: the value has no canonical form.
    """
    if _plain(value):
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: the general encoder decides
            pass
    try:
        return bytes(rfc8785.dumps(value))
    except rfc8785.CanonicalizationError as exc:
        raise NotCanonicalizable(str(exc)) from None


def _plain(value: JSONValue) -> bool:
    """Whether ``json.dumps`` writes ``value`` exactly as RFC 8785 does."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not key.isascii() or not _plain_scalar_or(item):
                return False
        return True
    if kind is list:
        return all(_plain_scalar_or(item) for item in value)
    return _plain_scalar_or(value)


def _plain_scalar_or(value: JSONValue) -> bool:
    # Scalars are checked inline: a record has dozens, and a call each would
    # cost more than the check.
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return True
    if kind is int:
        return bool(-_SAFE_INTEGER <= value <= _SAFE_INTEGER)
    if kind is dict or kind is list:
        return _plain(value)
    return False


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
