"""Step 5: validate the input against the registered JSON Schema (SI-2).

Policies and the handler see only input that passed. Issues name the path and
what is wrong, never the value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import orjson

from warden.shared.canonical import (
    JSONLimitError,
    NotCanonicalizable,
    canonical_json,
    compact_json,
    digest_of,
    strict_loads,
)
from warden.shared.schema import validation_issues
from warden_server.pipeline.context import BeginContext
from warden_server.pipeline.failure import Failure, fail

if TYPE_CHECKING:
    from warden_server.plane import Plane


def validate(plane: Plane, ctx: BeginContext) -> Failure | None:
    assert ctx.capability is not None
    text = ctx.request.input_json
    limit = plane.config.server.max_input_bytes
    if len(text.encode()) > limit:
        issue = {"path": "", "message": f"must be at most {limit} bytes of JSON"}
        return fail("INPUT_INVALID", "input-too-large", details={"issues": [issue]})
    try:
        value = strict_loads(text)
    except JSONLimitError as exc:
        issue = {"path": "", "message": exc.issue}
        return fail("INPUT_INVALID", "input-beyond-limits", details={"issues": [issue]})
    except ValueError:
        issue = {"path": "", "message": "must be a JSON document"}
        return fail("INPUT_INVALID", "input-not-json", stage="adapter", details={"issues": [issue]})
    ctx.input = value
    issues = [i.to_json() for i in validation_issues(ctx.capability.input_validator, value)]
    # Digests use RFC 8785, which (like I-JSON) admits only integers a double holds exactly.
    if _has_unsafe_integer(value):
        issues += [
            {"path": path, "message": f"must be an integer within ±{MAX_SAFE_INTEGER}"}
            for path in _unsafe_integers(value, "")
        ]
    if issues:
        if not _storable(value):
            ctx.input = None  # the record of the refusal cannot hold it either
            issues.append(NOT_UNICODE)
        return fail("INPUT_INVALID", "schema-violation", details={"issues": issues})
    try:
        canonical = canonical_json(value)
    except NotCanonicalizable:
        ctx.input = None  # nothing without a canonical form is stored or digested
        return fail("INPUT_INVALID", "not-canonicalizable", details={"issues": [NOT_UNICODE]})
    # The value as its canonical form reads back (``1.0`` is ``1``), and the
    # digest of those same bytes: what policies, approvers and the handler see
    # is exactly what was digested.
    ctx.input = orjson.loads(canonical)
    ctx.input_digest = digest_of(canonical)
    return None


MAX_SAFE_INTEGER = 2**53 - 1
NOT_UNICODE: Final = {"path": "", "message": "must contain only valid Unicode text"}


def _storable(value: object) -> bool:
    """Whether ``value`` can be written as UTF-8: JSON's escape for half a
    character (``"\\ud800"``) parses to a string that cannot."""
    try:
        compact_json(value).encode()
    except UnicodeEncodeError:
        return False
    return True


def _has_unsafe_integer(value: object) -> bool:
    """Whether ``_unsafe_integers`` would find any: its walk, without the paths."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) > MAX_SAFE_INTEGER
    if isinstance(value, dict):
        return any(map(_has_unsafe_integer, value.values()))
    if isinstance(value, list):
        return any(map(_has_unsafe_integer, value))
    return False


def _unsafe_integers(value: object, path: str) -> list[str]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [path] if abs(value) > MAX_SAFE_INTEGER else []
    if isinstance(value, dict):
        return [
            p
            for key, child in value.items()
            for p in _unsafe_integers(child, f"{path}/{_escape(str(key))}")
        ]
    if isinstance(value, list):
        return [p for i, child in enumerate(value) for p in _unsafe_integers(child, f"{path}/{i}")]
    return []


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
