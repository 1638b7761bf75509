"""The two-face error: defaults from the proto table, the two model shapes
(SI-9), the private cause (SI-10), the code/stage table against SPEC §1, and
the generated error reference."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warden import CapabilityError
from warden.shared.codes import CODES, CONCEALED_CODE, CONCEALED_MESSAGE, STAGES, defaults
from warden_server import docs_gen

ROOT = Path(__file__).resolve().parents[2]

# SPEC §1, copied by hand: the independent source the proto table must match.
# (code, stage, exposed, retryable); None = "—" in the SPEC (not specified).
SPEC_CODES: list[tuple[str, str, bool, bool | None]] = [
    ("CAPABILITY_NOT_FOUND", "discovery", True, False),
    ("INPUT_INVALID", "input-validation", True, False),
    ("UNAUTHENTICATED", "authentication", True, False),
    ("FORBIDDEN", "authorization", True, False),
    ("POLICY_DENIED", "policy", True, False),
    ("POLICY_FAILED", "policy", True, False),
    ("RATE_LIMITED", "policy", True, True),
    ("GOVERNANCE_UNAVAILABLE", "policy", True, True),
    ("APPROVAL_REQUIRED", "approval", True, False),
    ("APPROVAL_DENIED", "approval", True, False),
    ("APPROVAL_EXPIRED", "approval", True, True),
    ("IDEMPOTENCY_CONFLICT", "execution", True, False),
    ("OPERATION_IN_PROGRESS", "execution", True, True),
    ("INTERNAL_ERROR", "execution", False, None),
    ("OUTPUT_INVALID", "output-validation", False, None),
    ("TIMEOUT", "timeout", True, True),
    ("CANCELLED", "cancellation", True, True),
]

SPEC_STAGES = [
    "discovery",
    "input-validation",
    "authentication",
    "authorization",
    "policy",
    "approval",
    "execution",
    "output-validation",
    "timeout",
    "cancellation",
    "adapter",
]

EXPOSED_KEYS = {"code", "message", "retryable"}
CONCEALED = {"code": "INTERNAL_ERROR", "message": "The operation failed."}


# -- the table ----------------------------------------------------------------


@pytest.mark.parametrize(("code", "stage", "exposed", "retryable"), SPEC_CODES)
def test_spec_code_is_in_the_proto_table(
    code: str, stage: str, exposed: bool, retryable: bool | None
) -> None:
    entry = CODES[code]
    assert (entry.code, entry.stage, entry.exposed) == (code, stage, exposed)
    if retryable is not None:
        assert entry.retryable is retryable
    assert entry.public_message
    assert defaults(code) is entry


def test_spec_fixed_messages() -> None:
    assert CODES["CAPABILITY_NOT_FOUND"].public_message == "Capability not found."
    assert CONCEALED_CODE == "INTERNAL_ERROR"
    assert CONCEALED_MESSAGE == "The operation failed."


@pytest.mark.parametrize("stage", SPEC_STAGES)
def test_spec_stage_exists(stage: str) -> None:
    assert STAGES[stage].name == stage
    assert STAGES[stage].meaning


def test_every_code_stage_is_a_known_stage() -> None:
    assert {c.stage for c in CODES.values()} <= set(STAGES)


def test_unknown_code_has_no_defaults() -> None:
    with pytest.raises(KeyError):
        defaults("NOT_ELIGIBLE")


# -- CapabilityError defaults -------------------------------------------------


@pytest.mark.parametrize("code", sorted(CODES))
def test_builtin_code_defaults_come_from_the_table(code: str) -> None:
    error = CapabilityError(code)
    entry = CODES[code]
    assert error.code == code
    assert error.stage == entry.stage
    assert error.public_message == entry.public_message
    assert error.retryable is entry.retryable
    assert error.expose_to_model is entry.exposed
    assert error.details is None and error.cause is None


def test_explicit_values_override_the_defaults() -> None:
    error = CapabilityError(
        "INPUT_INVALID", "Bad arguments.", stage="adapter", retryable=True, details={"x": 1}
    )
    assert (error.stage, error.public_message, error.retryable) == (
        "adapter",
        "Bad arguments.",
        True,
    )
    assert error.details == {"x": 1}


def test_declared_code_defaults() -> None:
    """A declared code is execution-stage, exposed and not retryable unless said."""
    error = CapabilityError("NOT_ELIGIBLE", "This order cannot be refunded.")
    assert (error.stage, error.expose_to_model, error.retryable) == ("execution", True, False)
    assert error.to_model() == {
        "code": "NOT_ELIGIBLE",
        "message": "This order cannot be refunded.",
        "retryable": False,
    }


def test_concealed_builtin_codes_use_the_concealed_shape() -> None:
    for code in ("INTERNAL_ERROR", "OUTPUT_INVALID"):
        assert CapabilityError(code, "table users missing").to_model() == CONCEALED


# -- SI-9: exactly two shapes -------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=10)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
codes = st.sampled_from(sorted(CODES)) | st.from_regex(r"[A-Z][A-Z_]{0,15}", fullmatch=True)
details = st.none() | st.dictionaries(st.text(max_size=8), json_values, min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    code=codes,
    message=st.none() | st.text(max_size=40),
    stage=st.none() | st.sampled_from(SPEC_STAGES),
    retryable=st.none() | st.booleans(),
    expose=st.none() | st.booleans(),
    details=details,
)
def test_si9_to_model_has_exactly_one_of_two_shapes(
    code: str,
    message: str | None,
    stage: str | None,
    retryable: bool | None,
    expose: bool | None,
    details: dict[str, Any] | None,
) -> None:
    def make(cause: BaseException | None) -> CapabilityError:
        return CapabilityError(
            code,
            message,
            stage=stage,
            retryable=retryable,
            expose_to_model=expose,
            details=copy.deepcopy(details),
            cause=cause,
        )

    first = make(RuntimeError("SELECT secret FROM internals"))
    second = make(None)
    shape = first.to_model()
    if first.expose_to_model:
        expected_keys = EXPOSED_KEYS | ({"details"} if details else set())
        assert set(shape) == expected_keys
        assert shape["code"] == code
        assert shape["message"] == first.public_message
        assert shape["retryable"] is first.retryable
        if details:
            assert shape["details"] == details
    else:
        assert shape == CONCEALED
        assert list(shape) == ["code", "message"]
    assert json.dumps(shape) == json.dumps(second.to_model())
    assert "SELECT secret" not in json.dumps(shape)


def test_to_model_details_are_a_copy() -> None:
    error = CapabilityError("INPUT_INVALID", details={"issues": [{"path": "/a"}]})
    error.to_model()["details"]["issues"].append("injected")
    assert error.details == {"issues": [{"path": "/a"}]}


# -- SI-10: the cause stays private -------------------------------------------


@pytest.mark.parametrize("expose", [True, False])
def test_si10_cause_never_in_model_shape(expose: bool) -> None:
    cause = ValueError("password=hunter2 at db.internal:5432")
    error = CapabilityError("POLICY_DENIED", expose_to_model=expose, cause=cause, details={"a": 1})
    shape = error.to_model()
    text = json.dumps(shape)
    assert "hunter2" not in text and "db.internal" not in text
    assert cause not in shape.values()
    assert error.cause is cause


def test_pickling_drops_the_cause() -> None:
    error = CapabilityError(
        "NOT_ELIGIBLE",
        "Nope.",
        retryable=True,
        details={"order": "A1"},
        cause=RuntimeError("stack secrets"),
    )
    data = pickle.dumps(error)
    assert b"stack secrets" not in data
    copy_ = pickle.loads(data)
    assert copy_.cause is None
    assert (copy_.code, copy_.stage, copy_.public_message) == ("NOT_ELIGIBLE", "execution", "Nope.")
    assert (copy_.retryable, copy_.expose_to_model, copy_.details) == (True, True, {"order": "A1"})
    assert copy_.to_model() == error.to_model()


def test_str_and_repr_show_the_public_face_only() -> None:
    error = CapabilityError("TIMEOUT", cause=RuntimeError("private"))
    assert str(error) == "TIMEOUT (timeout): The operation timed out."
    assert "private" not in repr(error)


# -- the generated reference --------------------------------------------------


def test_errors_reference_matches_the_proto() -> None:
    """docs/reference/errors.md is generated; regenerate with `make proto`."""
    committed = (ROOT / "docs" / "reference" / "errors.md").read_text(encoding="utf-8")
    assert committed == docs_gen.render()


def test_errors_reference_lists_every_code_and_stage() -> None:
    text = docs_gen.render()
    for code in CODES:
        assert f"| `{code}` |" in text
    for stage in STAGES:
        assert f"| `{stage}` |" in text
