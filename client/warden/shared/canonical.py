"""Canonical JSON (RFC 8785) and the digests built on it.

An approver approves exactly these arguments, a grant is bound to exactly this
input, and the audit chain hashes exactly these bytes: all three rest on one
canonical form, computed here.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Final

import orjson
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
    integers within ±2^53 is written by ``orjson`` with sorted keys in
    exactly the RFC 8785 form (property tests hold the two to the same bytes),
    many times faster than the general encoder; it runs for every input,
    digest and audit record. Anything else (a number with a fraction, a key
    beyond ASCII, whose RFC 8785 order is by UTF-16 code units) takes the
    general encoder.

    Raises:
        NotCanonicalizable: the value has no canonical form.
    """
    if _plain(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # a lone surrogate, or deeper than orjson goes
            pass
    try:
        return bytes(rfc8785.dumps(value))
    except rfc8785.CanonicalizationError as exc:
        raise NotCanonicalizable(str(exc)) from None
    except UnicodeEncodeError:
        # A lone surrogate in a key: rfc8785 sorts keys by their UTF-16 form,
        # which has none.
        raise NotCanonicalizable("a key is not valid Unicode (a lone surrogate)") from None


def _plain(value: JSONValue) -> bool:
    """Whether ``orjson`` (and ``json.dumps`` with sorted keys, compact and
    unescaped) writes ``value`` exactly as RFC 8785 does."""
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


MAX_JSON_DEPTH: Final = 64
"""Arrays and objects nest at most this deep in JSON the plane accepts (input,
output, context, failure details, schemas); the SDK and the plane share it."""
MAX_INTEGER_DIGITS: Final = 32
"""Digits an integer literal may have: twice what a double holds exactly, and
far below the size whose conversion Python itself refuses."""


class JSONLimitError(ValueError):
    """JSON text that parses but is beyond a limit (depth, number range).

    ``str()`` reads after the field's name ("context_json is nested ...");
    ``issue`` reads as a validation issue ("must not be nested ...").
    """

    def __init__(self, problem: str, issue: str) -> None:
        super().__init__(problem)
        self.issue = issue


def strict_loads(text: str | bytes) -> JSONValue:
    """Parse JSON text, refusing the NaN and Infinity literals Python would
    accept, and values beyond the limits: nesting deeper than
    ``MAX_JSON_DEPTH``, numbers beyond a double, integers of more than
    ``MAX_INTEGER_DIGITS`` digits.

    Raises:
        JSONLimitError: the text is JSON beyond a limit.
        ValueError: the text is not strict JSON.
    """
    try:
        value = json.loads(
            text, parse_constant=_refuse_constant, parse_float=_float, parse_int=_int
        )
    except RecursionError:
        raise _too_deep() from None
    # A document with fewer brackets than the limit cannot nest beyond it.
    opened = text.count("[") + text.count("{") if isinstance(text, str) else len(text)
    if opened > MAX_JSON_DEPTH and _deeper_than(value, MAX_JSON_DEPTH):
        raise _too_deep()
    return value


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONLimitError(
            "has a number beyond the range of a double",
            "must not contain a number beyond the range of a double",
        )
    return value


def _int(text: str) -> int:
    if len(text) - text.startswith("-") > MAX_INTEGER_DIGITS:
        raise JSONLimitError(
            f"has an integer of more than {MAX_INTEGER_DIGITS} digits",
            f"must not contain an integer of more than {MAX_INTEGER_DIGITS} digits",
        )
    return int(text)


def _too_deep() -> JSONLimitError:
    return JSONLimitError(
        f"is nested more than {MAX_JSON_DEPTH} levels deep",
        f"must not be nested more than {MAX_JSON_DEPTH} levels deep",
    )


def _deeper_than(value: JSONValue, limit: int) -> bool:
    """Whether arrays and objects nest in ``value`` more than ``limit`` deep."""
    if type(value) is not dict and type(value) is not list:
        return False
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        children = node.values() if type(node) is dict else node
        for child in children:
            if type(child) is dict or type(child) is list:
                if depth >= limit:
                    return True
                pending.append((child, depth + 1))
    return False


def digest(value: JSONValue) -> str:
    """SHA-256 of the canonical form, as ``sha256:<hex>``."""
    return digest_of(canonical_json(value))


def digest_of(canonical: bytes) -> str:
    """``digest`` of a value whose canonical form is already at hand."""
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def compact_json(value: JSONValue) -> str:
    """Compact, key-sorted JSON text for storage and the wire.

    The text is ``json.dumps``'s (compact, sorted keys, Unicode unescaped);
    a value of the plain kinds is written by ``orjson``, which writes it the
    same, several times faster.
    """
    if _plain(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        except orjson.JSONEncodeError:  # a lone surrogate: json.dumps writes it
            pass
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
