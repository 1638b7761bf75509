"""Step 5: validate the input against the registered JSON Schema (SI-2).

Policies and the handler see only input that passed. Issues name the path and
what is wrong, never the value.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from warden.shared.canonical import digest
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
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        issue = {"path": "", "message": "must be a JSON document"}
        return fail("INPUT_INVALID", "input-not-json", stage="adapter", details={"issues": [issue]})
    ctx.input = value
    issues = validation_issues(ctx.capability.input_validator, value)
    if issues:
        return fail(
            "INPUT_INVALID", "schema-violation", details={"issues": [i.to_json() for i in issues]}
        )
    ctx.input_digest = digest(value)
    return None
