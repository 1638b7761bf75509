"""The calls each adapter is tested with: every status and every class of
failure a model can meet, with deterministic inputs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent / "golden"


@dataclass(frozen=True, slots=True)
class Case:
    """One call through an adapter, and what it must come to."""

    name: str
    capability: str
    arguments: dict[str, Any]
    model_code: str | None
    """The code a model sees; None when the call succeeds."""
    recorded_code: str | None
    """The code the audit log records for the attempt (the truth behind a concealment)."""
    roles: tuple[str, ...] = ("support",)
    authenticated: bool = True

    @property
    def status(self) -> str:
        if self.model_code is None:
            return "succeeded"
        return "suspended" if self.model_code == "APPROVAL_REQUIRED" else "failed"


CASES = [
    Case("succeeded", "orders.echo", {"n": 7, "note": "hi"}, None, None),
    Case("succeeded-model-hidden", "orders.profile", {"n": 3}, None, None),
    Case("suspended", "orders.echo", {"n": 42}, "APPROVAL_REQUIRED", "APPROVAL_REQUIRED"),
    Case("not-found-unknown", "orders.nope", {"n": 1}, *["CAPABILITY_NOT_FOUND"] * 2),
    Case("not-found-unexposed", "orders.direct_only", {"n": 1}, *["CAPABILITY_NOT_FOUND"] * 2),
    Case("not-found-hidden", "orders.secret", {"n": 1}, *["CAPABILITY_NOT_FOUND"] * 2),
    Case("input-invalid", "orders.echo", {"n": -1, "note": 5}, "INPUT_INVALID", "INPUT_INVALID"),
    Case(
        "unauthenticated",
        "orders.echo",
        {"n": 1},
        "UNAUTHENTICATED",
        "UNAUTHENTICATED",
        authenticated=False,
    ),
    Case("forbidden", "orders.admin", {"n": 1}, "FORBIDDEN", "FORBIDDEN"),
    Case("policy-denied", "orders.echo", {"n": 101}, "POLICY_DENIED", "POLICY_DENIED"),
    Case("policy-failed", "orders.echo", {"n": 13}, "POLICY_FAILED", "POLICY_FAILED"),
    Case("declared-error", "orders.echo", {"n": 1, "note": "refuse"}, *["NOT_ELIGIBLE"] * 2),
    Case("internal-error", "orders.echo", {"n": 1, "note": "explode"}, *["INTERNAL_ERROR"] * 2),
    Case(
        "output-invalid", "orders.echo", {"n": 1, "note": "lie"}, "INTERNAL_ERROR", "OUTPUT_INVALID"
    ),
    Case("timeout", "orders.slow", {"n": 600}, "TIMEOUT", "TIMEOUT"),
]

CONCEALMENT = ["not-found-unknown", "not-found-unexposed", "not-found-hidden"]
FAILURES = [c for c in CASES if c.model_code is not None]


def case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def normalised(text: str, shape: Any) -> str:
    """The text with the fields that differ from run to run replaced, and only
    those: a suspension's approval id and expiry."""
    details = shape.get("details") if isinstance(shape, dict) else None
    if isinstance(details, dict) and "approval_id" in details:
        text = text.replace(details["approval_id"], "<approval-id>")
        text = text.replace(details["expires_at"], "<expires-at>")
    return text


def check_golden(path: Path, text: str, update: bool) -> None:
    """Compare the exact text with a golden file (rewritten with --update-golden)."""
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    assert path.exists(), f"no golden file {path.name}: run pytest with --update-golden"
    assert text + "\n" == path.read_text(), f"output differs from {path}"


APPROVAL_ID = re.compile(r"^[0-9a-f]{32}$")


def assert_real_approval(shape: dict[str, Any], pending: list[dict[str, Any]]) -> None:
    """What normalisation replaces is the plane's real pending approval."""
    details = shape["details"]
    assert APPROVAL_ID.match(details["approval_id"])
    assert [p["approval_id"] for p in pending] == [details["approval_id"]]
    assert details["expires_at"].endswith("Z")


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
