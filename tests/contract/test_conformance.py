"""The conformance vectors of tests/conformance/, run by the Python SDK.

The TypeScript SDK runs the same files (client/typescript/test/conformance.test.ts);
a vector changed for one language breaks the other.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import warden
from warden._envelope import Envelope
from warden.adapters import mcp, openai
from warden.adapters._translate import answer
from warden.shared.canonical import NotCanonicalizable, canonical_json, digest, strict_loads
from warden.shared.redaction import sensitive_texts
from warden.shared.schema import redact, strip_model_hidden

VECTORS = Path(__file__).resolve().parents[1] / "conformance"
Case = dict[str, Any]


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((VECTORS / name).read_text(encoding="utf-8"))
    return document


def error_of(spec: dict[str, Any]) -> warden.CapabilityError:
    return warden.CapabilityError(
        spec["code"],
        spec.get("public_message"),
        stage=spec.get("stage"),
        retryable=spec.get("retryable"),
        expose_to_model=spec.get("expose_to_model"),
        details=spec.get("details"),
    )


def envelope_of(spec: dict[str, Any]) -> Envelope:
    status = spec["status"]
    if status == "succeeded":
        schema = spec.get("output_schema", {})
        return Envelope(
            "succeeded",
            "inv",
            output=spec["output"],
            model_output=strip_model_hidden(spec["output"], schema),
        )
    return Envelope(
        status,
        "inv",
        error=error_of(spec["error"]),
        approval_id=spec.get("approval_id"),
        executed_before_failure=spec.get("executed_before_failure", False),
        replayed_from="original" if spec.get("replayed") else None,
    )


def run_error(case: Case) -> None:
    error = error_of(case["error"])
    expect = case["expect"]
    assert error.stage == expect["stage"]
    assert error.public_message == expect["public_message"]
    assert error.retryable == expect["retryable"]
    assert error.expose_to_model == expect["expose_to_model"]
    assert error.to_model() == expect["model"]
    assert answer(Envelope("failed", "inv", error=error)).text == expect["model_json"]


def run_envelope(case: Case) -> None:
    envelope = envelope_of(case["envelope"])
    expect = case["expect"]
    if "returns" in expect:
        assert warden.unwrap(envelope) == expect["returns"]
        return
    with pytest.raises(warden.CapabilityError) as raised:
        warden.unwrap(envelope)
    assert raised.value.to_model() == expect["throws"]


def run_retry(case: Case) -> None:
    envelope = envelope_of(case["envelope"])
    verdict = warden.may_retry(envelope, case["side_effect"], case["idempotency_key"] or "")
    assert verdict is case["expect"]


def run_canonical(case: Case) -> None:
    value = strict_loads(case["json"])
    if case.get("refused"):
        with pytest.raises(NotCanonicalizable):
            canonical_json(value)
        return
    assert canonical_json(value).decode("utf-8") == case["canonical"]
    assert digest(value) == case["digest"]


GRANT_KEYS = load("grants.json")["keys"]
REFUSALS: list[tuple[str, str]] = [
    ("not a grant token", "malformed"),
    ("signed by an unknown key", "unknown-key"),
    ("grant rejected", "rejected"),
    ("grant expired", "expired"),
    ("the grant is for another input", "wrong-input"),
    ("the grant is for ", "wrong-capability"),
]


def refusal_of(message: str) -> str:
    """The reason class of a GrantVerificationError's message."""
    return next(reason for prefix, reason in REFUSALS if message.startswith(prefix))


def run_grant(case: Case) -> None:
    keys = [
        warden.GrantKey(GRANT_KEYS[k]["key_id"], GRANT_KEYS[k]["public_key_pem"])
        for k in case["keys"]
    ]

    def verify() -> Any:
        return warden.verify_grant(
            case["token"],
            keys,
            capability_id=case["capability_id"],
            input=case["input"],
            now=case["now"],
            leeway_s=case["leeway_s"],
        )

    expect = case["expect"]
    if "claims" in expect:
        claims = verify()
        assert {name: getattr(claims, name) for name in expect["claims"]} == expect["claims"]
        return
    with pytest.raises(warden.GrantVerificationError) as refused:
        verify()
    assert refusal_of(str(refused.value)) == expect["refused"]


def run_marking(case: Case) -> None:
    schema, value, expect = case["schema"], case["value"], case["expect"]
    assert redact(value, schema) == expect["redacted"]
    assert strip_model_hidden(value, schema) == expect["model_visible"]
    assert set(expect["sensitive_texts"]) <= sensitive_texts(value, schema)


def run_adapter(case: Case) -> None:
    result = answer(envelope_of(case["envelope"]))
    expect = case["expect"]
    assert result.text == expect["openai"]
    if result.conceals_capability:
        error = {"code": -32602, "message": mcp.UNKNOWN_TOOL, "data": result.value}
        assert {"error": error} == expect["mcp"]
        return
    tool_result = mcp._tool_result(result)
    shown: dict[str, Any] = {
        "content": [{"type": c.type, "text": c.text} for c in tool_result.content],
        "isError": tool_result.is_error,
    }
    if tool_result.structured_content is not None:
        shown["structuredContent"] = tool_result.structured_content
    assert {"result": shown} == expect["mcp"]


def run_strict_tool(case: Case) -> None:
    expect = case["expect"]
    if "strict" in expect:
        assert openai.strict_schema(case["schema"]) == expect["strict"]
        return
    passed = openai.strict_arguments(case["arguments"], case["schema"])
    if "text" in expect:
        assert passed == expect["text"]
    else:
        assert json.loads(passed) == expect["arguments"]


RUNNERS: dict[str, Callable[[Case], None]] = {
    "errors.json": run_error,
    "envelopes.json": run_envelope,
    "retries.json": run_retry,
    "canonical.json": run_canonical,
    "grants.json": run_grant,
    "markings.json": run_marking,
    "adapters.json": run_adapter,
    "strict-tools.json": run_strict_tool,
}
CASES = [
    pytest.param(name, case, id=f"{name}:{case['name']}")
    for name in sorted(RUNNERS)
    for case in load(name)["cases"]
]


@pytest.mark.parametrize(("file", "case"), CASES)
def test_conformance_vector(file: str, case: Case) -> None:
    RUNNERS[file](case)


def test_conformance_every_vector_file_has_a_runner() -> None:
    assert sorted(p.name for p in VECTORS.glob("*.json")) == sorted(RUNNERS)


def test_conformance_suite_reads_every_case() -> None:
    """Counted from the files themselves, not from what the suite chose to load."""
    on_disk = {
        f"{path.name}:{case['name']}"
        for path in VECTORS.glob("*.json")
        for case in json.loads(path.read_text(encoding="utf-8"))["cases"]
    }
    total = sum(
        len(json.loads(p.read_text(encoding="utf-8"))["cases"]) for p in VECTORS.glob("*.json")
    )
    assert len(on_disk) == total, "case names must be unique within a file"
    assert {param.id for param in CASES} == on_disk
    assert all(json.loads(p.read_text(encoding="utf-8"))["cases"] for p in VECTORS.glob("*.json"))
