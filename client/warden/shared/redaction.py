"""Sensitive values (SI-5): the form they are stored in, and scrubbing them out
of free text.

A field marked ``x-warden-sensitive`` is stored either masked (``[REDACTED]``)
or as a keyed hash (HMAC-SHA256 over its canonical JSON), so that a security
team can still tell that two records carry the same value without anyone
learning the value. Free text (exception messages, stacks, error details)
cannot be walked with a schema, so the values themselves are searched for and
masked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from warden.shared.canonical import JSONValue, canonical_json
from warden.shared.schema import REDACTED, Schema, redact

HASH_PREFIX: Final = "hmac-sha256:"
MIN_SCRUB_CHARS: Final = 3
"""Shorter values are not searched for in free text: masking every ``1`` or
``ok`` would destroy the text and protect nothing worth protecting."""


@dataclass(frozen=True, slots=True)
class Redaction:
    """How sensitive values are stored.

    Attributes:
        hash_key: When set, a sensitive value is stored as
            ``hmac-sha256:<hex>`` under this key (equal values give equal
            hashes); when None it is stored as ``[REDACTED]``.
    """

    hash_key: bytes | None = field(default=None, repr=False)

    def value(self, value: JSONValue, schema: Schema) -> JSONValue:
        """A copy of ``value`` with every sensitive field in its stored form."""
        return redact(value, schema, self.replacement)

    def replacement(self, value: JSONValue) -> JSONValue:
        """The stored form of one sensitive value."""
        if self.hash_key is None:
            return REDACTED
        mac = hmac.new(self.hash_key, canonical_json(value), hashlib.sha256)
        return HASH_PREFIX + mac.hexdigest()


def sensitive_texts(value: JSONValue, schema: Schema) -> frozenset[str]:
    """The text forms of every sensitive string and number in ``value``.

    Each value is given as written, JSON-escaped and ``repr``-escaped, so that
    an exception message or a stack that quotes it is still found.
    """
    found: set[str] = set()

    def collect(sensitive: JSONValue) -> JSONValue:
        found.update(_scalar_texts(sensitive))
        return REDACTED

    try:
        redact(value, schema, collect)
    except RecursionError:  # pragma: no cover - values nested beyond Python's stack
        return frozenset()
    return frozenset(text for text in found if len(text) >= MIN_SCRUB_CHARS)


def scrub_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret masked, longest first."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


VALIDATION_REFUSED: Final = "was refused by the capability's validation"
"""An input issue's message in place of one that repeats a value of the input."""


def value_texts(value: JSONValue) -> frozenset[str]:
    """The text forms of every string and number in ``value`` long enough to
    search for (``MIN_SCRUB_CHARS``), as ``sensitive_texts`` gives them."""
    return frozenset(text for text in _scalar_texts(value) if len(text) >= MIN_SCRUB_CHARS)


def unechoed(message: str, texts: Iterable[str]) -> str:
    """An input issue's message, or ``VALIDATION_REFUSED`` when it repeats a
    value of the input: a validator's own text may quote what it refused, and
    issue messages never echo values (SPEC §1, SI-5)."""
    return VALIDATION_REFUSED if any(text in message for text in texts) else message


def scrub_json(value: JSONValue, secrets: Iterable[str]) -> JSONValue:
    """A copy of ``value`` whose strings (and keys) have every secret masked."""
    known = frozenset(secrets)
    if not known:
        return value

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return scrub_text(node, known)
        if isinstance(node, dict):
            return {scrub_text(str(k), known): walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, bool) or node is None:
            return node
        text = str(node)
        return REDACTED if any(secret in text for secret in known) else node

    return walk(value)


def _scalar_texts(value: JSONValue) -> Iterable[str]:
    if isinstance(value, dict):
        for child in value.values():
            yield from _scalar_texts(child)
    elif isinstance(value, list):
        for child in value:
            yield from _scalar_texts(child)
    elif isinstance(value, str):
        yield value
        yield json.dumps(value)[1:-1]
        yield json.dumps(value, ensure_ascii=False)[1:-1]
        yield repr(value)[1:-1]
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield str(value)
        yield json.dumps(value)
