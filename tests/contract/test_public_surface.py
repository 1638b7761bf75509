"""The SDK's public surface (SPEC §1, §2, §5): names that code outside the
project relies on."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

import warden

PUBLIC_NAMES = [
    "Actor",
    "Approval",
    "ApprovalError",
    "ApprovalEvent",
    "Approvals",
    "CancelToken",
    "CapabilityError",
    "Context",
    "DeclaredError",
    "DiscoveredCapability",
    "Envelope",
    "GrantClaims",
    "GrantKey",
    "GrantVerificationError",
    "ModelHidden",
    "NO_RETRY",
    "RegisteredCapability",
    "RetryPolicy",
    "Runtime",
    "Sensitive",
    "TLS",
    "WardenError",
    "may_retry",
    "unwrap",
    "verify_grant",
]

CAPABILITY_KEYWORDS = [
    "input",
    "output",
    "side_effect",
    "errors",
    "timeout_ms",
    "exposure",
    "required_roles",
    "tags",
    "description",
    "version",
]

INVOKE_KEYWORDS = [
    "actor",
    "context",
    "surface",
    "approval_id",
    "idempotency_key",
    "timeout_ms",
    "retry",
    "cancel",
]


def test_all_is_pinned() -> None:
    assert sorted(warden.__all__) == sorted(PUBLIC_NAMES)
    assert len(warden.__all__) == len(set(warden.__all__))


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_public_name_is_importable(name: str) -> None:
    module = importlib.import_module("warden")
    assert getattr(module, name) is getattr(warden, name)


def test_capability_error_is_an_exception() -> None:
    assert issubclass(warden.CapabilityError, Exception)


def _keyword_names(function: object) -> set[str]:
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {p.name for p in inspect.signature(function).parameters.values() if p.kind in kinds}


def test_capability_decorator_keywords() -> None:
    names = _keyword_names(warden.Runtime.capability)
    assert set(CAPABILITY_KEYWORDS) <= names


@pytest.mark.parametrize("method", ["invoke", "ainvoke"])
def test_invoke_keywords(method: str) -> None:
    function = getattr(warden.Runtime, method)
    assert set(INVOKE_KEYWORDS) <= _keyword_names(function)
    parameters = inspect.signature(function).parameters
    assert parameters["surface"].default == "direct"


def test_ainvoke_is_async_and_invoke_is_not() -> None:
    assert inspect.iscoroutinefunction(warden.Runtime.ainvoke)
    assert not inspect.iscoroutinefunction(warden.Runtime.invoke)


def test_envelope_attributes() -> None:
    fields = {f.name for f in dataclasses.fields(warden.Envelope)}
    assert {"status", "output", "error", "approval_id", "invocation_id"} <= fields
    envelope = warden.Envelope("succeeded", "inv-1", output={"ok": True})
    for name in ("status", "output", "error", "approval_id", "invocation_id"):
        assert hasattr(envelope, name)
    assert warden.unwrap(envelope) == {"ok": True}


def test_unwrap_raises_the_envelopes_error() -> None:
    error = warden.CapabilityError("POLICY_DENIED")
    with pytest.raises(warden.CapabilityError) as caught:
        warden.unwrap(warden.Envelope("failed", "inv-2", error=error))
    assert caught.value is error


def test_capability_error_attributes() -> None:
    cause = RuntimeError("private")
    error = warden.CapabilityError("POLICY_DENIED", "No.", details={"k": 1}, cause=cause)
    assert error.code == "POLICY_DENIED"
    assert error.stage == "policy"
    assert error.public_message == "No."
    assert error.retryable is False
    assert error.expose_to_model is True
    assert error.details == {"k": 1}
    assert error.cause is cause
    assert callable(error.to_model)
