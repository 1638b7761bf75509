"""Every status and every error code reachable through invoke, end to end."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pydantic
import pytest

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.lab import EchoOut, Lab, build_lab


def outcome(plant: Plant, invocation_id: str) -> dict[str, Any]:
    (row,) = plant.events(invocation_id=invocation_id, kind="outcome")
    return row


def decision(plant: Plant, invocation_id: str) -> dict[str, Any]:
    (row,) = plant.events(invocation_id=invocation_id, kind="decision")
    return row


def test_succeeded_returns_the_validated_output_and_records_both_halves(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = lab_rt.invoke("orders.echo", {"n": 7, "note": "hi"}, actor=lab_plant.token())
    assert env.status == "succeeded"
    assert env.output == EchoOut(n=7, note="hi")
    assert warden.unwrap(env) == EchoOut(n=7, note="hi")
    assert env.error is None and env.approval_id is None
    assert decision(lab_plant, env.invocation_id)["status"] == "granted"
    row = outcome(lab_plant, env.invocation_id)
    assert row["status"] == "succeeded"
    assert json.loads(row["output"]) == {"n": 7, "note": "hi"}
    assert row["executed_before_failure"] == 0


def test_suspended_carries_approval_required_and_the_approval_id(
    lab_rt: warden.Runtime, lab_plant: Plant, lab: Lab
) -> None:
    env = lab_rt.invoke("orders.echo", {"n": 42}, actor=lab_plant.token())
    assert env.status == "suspended"
    assert env.error is not None and env.error.code == "APPROVAL_REQUIRED"
    assert env.error.stage == "approval"
    assert env.error.public_message == "Forty-two needs a second pair of eyes."
    assert env.approval_id and env.error.details is not None
    assert env.error.details["approval_id"] == env.approval_id
    assert env.error.details["expires_at"].endswith("Z")
    assert lab.count("echo") == 0
    (approval,) = lab_plant.rows("SELECT * FROM approvals")
    assert approval["approval_id"] == env.approval_id and approval["state"] == "pending"
    with pytest.raises(warden.CapabilityError) as raised:
        warden.unwrap(env)
    assert raised.value.code == "APPROVAL_REQUIRED"


def test_cancelled_when_the_caller_cancels_a_running_handler(lab_plant: Plant, lab: Lab) -> None:
    async def scenario() -> warden.Envelope:
        rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab)
        try:
            await rt.aregister()
            task = asyncio.create_task(
                rt.ainvoke("orders.aslow", {"n": 150}, actor=lab_plant.token())
            )
            while lab.count("aslow") == 0:
                await asyncio.sleep(0.005)
            task.cancel()
            return await task
        finally:
            await rt.aclose()
            rt.close()

    env = asyncio.run(scenario())
    assert env.status == "cancelled"
    assert env.error is not None and env.error.code == "CANCELLED"
    assert env.error.stage == "cancellation" and env.error.retryable
    row = outcome(lab_plant, env.invocation_id)
    assert row["status"] == "cancelled" and row["code"] == "CANCELLED"


@pytest.mark.parametrize(
    ("capability", "arguments", "roles", "code", "stage"),
    [
        ("orders.nope", {"n": 1}, ("support",), "CAPABILITY_NOT_FOUND", "discovery"),
        ("orders.echo", {"n": -1}, ("support",), "INPUT_INVALID", "input-validation"),
        ("orders.admin", {"n": 1}, ("support",), "FORBIDDEN", "authorization"),
        ("orders.echo", {"n": 101}, ("support",), "POLICY_DENIED", "policy"),
        ("orders.echo", {"n": 1}, ("nobody",), "POLICY_DENIED", "policy"),
        ("orders.echo", {"n": 13}, ("support",), "POLICY_FAILED", "policy"),
        ("orders.echo", {"n": 1, "note": "refuse"}, ("support",), "NOT_ELIGIBLE", "execution"),
        ("orders.echo", {"n": 1, "note": "explode"}, ("support",), "INTERNAL_ERROR", "execution"),
        (
            "orders.echo",
            {"n": 1, "note": "undeclared"},
            ("support",),
            "INTERNAL_ERROR",
            "execution",
        ),
        (
            "orders.echo",
            {"n": 1, "note": "lie"},
            ("support",),
            "OUTPUT_INVALID",
            "output-validation",
        ),
        ("orders.slow", {"n": 600}, ("support",), "TIMEOUT", "timeout"),
        ("orders.aslow", {"n": 600}, ("support",), "TIMEOUT", "timeout"),
    ],
)
def test_failed_codes_and_stages(
    lab_rt: warden.Runtime,
    lab_plant: Plant,
    capability: str,
    arguments: dict[str, Any],
    roles: tuple[str, ...],
    code: str,
    stage: str,
) -> None:
    env = lab_rt.invoke(capability, arguments, actor=lab_plant.token(roles=roles))
    assert env.status == "failed"
    assert env.error is not None
    assert (env.error.code, env.error.stage) == (code, stage)
    recorded = lab_plant.events(invocation_id=env.invocation_id)
    assert recorded, "every attempt is audited"
    assert recorded[-1]["code"] == code and recorded[-1]["stage"] == stage


def test_unauthenticated_for_missing_expired_and_forged_tokens(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    import jwt

    good = lab_plant.token()
    forged = jwt.encode(
        {**jwt.decode(good, options={"verify_signature": False})},
        "another-secret-of-sufficient-length-123",
        algorithm="HS256",
    )
    expired = lab_plant.token(ttl=-120)
    reasons = []
    for actor in (None, "not-a-jwt", forged, expired):
        env = lab_rt.invoke("orders.echo", {"n": 1}, actor=actor)
        assert env.status == "failed" and env.error is not None
        assert (env.error.code, env.error.stage) == ("UNAUTHENTICATED", "authentication")
        assert env.error.public_message == "Authentication is required."
        reasons.append(decision(lab_plant, env.invocation_id)["reason"])
    assert reasons[0] == "no actor token"
    assert "signature" in reasons[2]
    assert "expired" in reasons[3]


def test_input_invalid_details_name_paths_and_never_values(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = lab_rt.invoke(
        "orders.echo", {"n": "seven-hundred-thirty", "note": 99}, actor=lab_plant.token()
    )
    assert env.error is not None and env.error.code == "INPUT_INVALID"
    assert env.error.details == {
        "issues": [
            {"path": "/n", "message": "must be of type integer"},
            {"path": "/note", "message": "must be of type string"},
        ]
    }
    assert "seven-hundred-thirty" not in json.dumps(env.error.to_model())


def test_unparsable_arguments_fail_at_the_adapter_stage(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = lab_rt.invoke("orders.echo", {"n": {1, 2}}, actor=lab_plant.token())  # type: ignore[dict-item]
    assert env.error is not None
    assert (env.error.code, env.error.stage) == ("INPUT_INVALID", "adapter")


def test_arguments_given_as_json_text_reach_the_plane_as_written(
    lab_rt: warden.Runtime, lab_plant: Plant, lab: Lab
) -> None:
    env = lab_rt.invoke("orders.echo", '{"n": 2, "note": "text"}', actor=lab_plant.token())
    assert env.status == "succeeded" and env.output == EchoOut(n=2, note="text")
    env = lab_rt.invoke("orders.echo", '{"n": 2', actor=lab_plant.token())
    assert env.error is not None
    assert (env.error.code, env.error.stage) == ("INPUT_INVALID", "adapter")
    assert decision(lab_plant, env.invocation_id)["reason"] == "input-not-json"
    assert lab.count("echo") == 1


def test_declared_error_is_exposed_with_its_message_and_details(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = lab_rt.invoke("orders.echo", {"n": 1, "note": "refuse"}, actor=lab_plant.token())
    assert env.error is not None
    assert env.error.to_model() == {
        "code": "NOT_ELIGIBLE",
        "message": "This number cannot be echoed.",
        "retryable": False,
        "details": {"hint": "use another note"},
    }
    assert not env.executed_before_failure


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    "details",
    [
        {"ratio": float("nan")},
        {"at": datetime(2026, 1, 2, tzinfo=UTC)},
        {"big": float("inf")},
        {"text": "x" * (64 * 1024)},  # its JSON is larger than the plane records
        {"id": 2**53 + 1},
        {"text": "\ud800"},
        nested(65),
    ],
    ids=["nan", "datetime", "infinity", "too-large", "unsafe-integer", "surrogate", "too-deep"],
)
def test_a_declared_error_whose_details_are_not_json_is_concealed(
    lab_plant: Plant, details: dict[str, Any]
) -> None:
    """Details are for a model and an audit record to read as JSON: ones no
    reader takes, or the plane would not record, are the handler breaking its
    contract, concealed like any other internal failure (the SDKs wrote NaN
    into the model's text, or raised TypeError out of the function-calling
    adapter; details over 64 KiB were shown while the plane refused the
    report, so the audit log never had the outcome)."""
    env, outcome = raised_with_details(lab_plant, details)
    assert env.error is not None
    assert env.error.to_model() == {"code": "INTERNAL_ERROR", "message": "The operation failed."}
    assert env.executed_before_failure
    assert isinstance(env.error.cause, warden.CapabilityError) and env.error.cause.code == "ODD"
    assert (outcome["status"], outcome["code"]) == ("failed", "INTERNAL_ERROR")


def test_declared_details_as_large_as_the_plane_records_are_shown_and_recorded(
    lab_plant: Plant,
) -> None:
    details = {"text": "x" * (64 * 1024 - len('{"text":""}'))}
    env, outcome = raised_with_details(lab_plant, details)
    assert env.error is not None and env.error.to_model()["details"] == details
    assert (outcome["status"], outcome["code"]) == ("failed", "ODD")


def raised_with_details(
    plant: Plant, details: dict[str, Any]
) -> tuple[warden.Envelope, dict[str, Any]]:
    """A call whose handler raises a declared error with ``details``, and its
    outcome as the audit log recorded it (every report taken)."""
    rt = warden.Runtime(plant.target, service="orders", token=ORDERS_TOKEN)

    @rt.capability(
        "orders.odd",
        input=EchoOut,
        output=EchoOut,
        side_effect="read",
        errors={"ODD": "Odd numbers are refused."},
    )
    def odd(inp: EchoOut, ctx: warden.Context) -> EchoOut:
        raise ctx.errors.ODD(details=details)

    try:
        env = rt.invoke("orders.odd", {"n": 1}, actor=plant.token())
        assert rt.flush(timeout_ms=10_000) == 0
    finally:
        rt.close()
    (outcome,) = plant.events(kind="outcome", invocation_id=env.invocation_id)
    return env, outcome


def test_output_invalid_withholds_output_and_reports_execution(
    lab_rt: warden.Runtime, lab_plant: Plant, lab: Lab
) -> None:
    env = lab_rt.invoke("orders.echo", {"n": 1, "note": "lie"}, actor=lab_plant.token())
    assert env.output is None
    assert env.executed_before_failure
    assert env.error is not None and env.error.to_model() == {
        "code": "INTERNAL_ERROR",
        "message": "The operation failed.",
    }
    assert lab.count("echo") == 1
    row = outcome(lab_plant, env.invocation_id)
    assert row["code"] == "OUTPUT_INVALID" and row["executed_before_failure"] == 1
    assert row["output"] is None
    assert "must be of type integer" in row["cause_message"]


def test_timeout_reports_that_the_handler_had_started(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = lab_rt.invoke("orders.slow", {"n": 600}, actor=lab_plant.token())
    assert env.error is not None and env.error.retryable
    assert env.executed_before_failure
    assert outcome(lab_plant, env.invocation_id)["executed_before_failure"] == 1


def test_a_call_budget_below_the_capability_budget_applies(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = lab_rt.invoke("orders.slow", {"n": 120}, actor=lab_plant.token(), timeout_ms=30)
    assert env.error is not None and env.error.code == "TIMEOUT"
    fast = lab_rt.invoke("orders.slow", {"n": 1}, actor=lab_plant.token(), timeout_ms=5000)
    assert fast.status == "succeeded"


@pytest.mark.fixed_processes
def test_governance_unavailable_when_the_plane_is_down(lab: Lab) -> None:
    rt = build_lab("127.0.0.1:9", ORDERS_TOKEN, lab, governance_timeout_ms=300)
    try:
        env = rt.invoke("orders.echo", {"n": 1}, actor="whatever")
    finally:
        rt.close()
    assert env.status == "failed" and env.error is not None
    assert (env.error.code, env.error.stage) == ("GOVERNANCE_UNAVAILABLE", "policy")
    assert lab.count("echo") == 0


def test_ainvoke_is_the_async_twin(lab_plant: Plant, lab: Lab) -> None:
    async def scenario() -> list[warden.Envelope]:
        rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab)
        try:
            return list(
                await asyncio.gather(
                    *(
                        rt.ainvoke("orders.echo", {"n": n}, actor=lab_plant.token())
                        for n in range(5)
                    )
                )
            )
        finally:
            await rt.aclose()
            rt.close()

    envelopes = asyncio.run(scenario())
    assert [e.output.n for e in envelopes] == list(range(5))
    assert len({e.invocation_id for e in envelopes}) == 5


def test_handler_context_carries_the_verified_actor(lab_plant: Plant) -> None:
    seen: list[warden.Context] = []
    rt = warden.Runtime(lab_plant.target, service="orders", token=ORDERS_TOKEN)

    @rt.capability("orders.whoami", input=EchoOut, output=EchoOut, side_effect="read")
    def whoami(inp: EchoOut, ctx: warden.Context) -> EchoOut:
        seen.append(ctx)
        return inp

    try:
        env = rt.invoke(
            "orders.whoami",
            {"n": 1},
            actor=lab_plant.token(
                sub="alice", roles=("support", "auditor"), tenant="acme", desk="emea"
            ),
        )
    finally:
        rt.close()
    assert env.status == "succeeded"
    (ctx,) = seen
    assert ctx.actor.id == "alice" and ctx.actor.tenant == "acme"
    assert ctx.actor.roles == ("support", "auditor")
    assert ctx.actor.attrs["desk"] == "emea"
    assert ctx.invocation_id == env.invocation_id


class Coupon(pydantic.BaseModel):
    code: str
    n: int

    @pydantic.field_validator("code")
    @classmethod
    def known(cls, code: str) -> str:
        if code.startswith("x"):
            raise ValueError(f"code {code!r} collides with a row of internal_users")
        return code

    @pydantic.field_validator("n")
    @classmethod
    def even(cls, n: int) -> int:
        if n % 2:
            raise ValueError("must be even")
        return n


def test_a_validators_message_reaches_the_model_only_when_it_repeats_no_value(
    lab_plant: Plant,
) -> None:
    """The SDK's own validation (a pydantic validator) words an issue as its
    author did, without pydantic's prefix, unless the text quotes a value of
    the input: then the model gets a fixed message, and the whole text stays
    in the private cause (SPEC §1: values are never echoed)."""
    rt = warden.Runtime(lab_plant.target, service="orders", token=ORDERS_TOKEN)

    @rt.capability("orders.coupon", input=Coupon, output=EchoOut, side_effect="read")
    def coupon(inp: Coupon, ctx: warden.Context) -> EchoOut:
        return EchoOut(n=inp.n)

    try:
        env = rt.invoke("orders.coupon", {"code": "xyz-secret", "n": 3}, actor=lab_plant.token())
    finally:
        rt.close()
    assert env.error is not None and env.error.code == "INPUT_INVALID"
    assert env.error.details == {
        "issues": [
            {"path": "/code", "message": "was refused by the capability's validation"},
            {"path": "/n", "message": "must be even"},
        ]
    }
    assert "xyz-secret" not in json.dumps(env.error.to_model())
    assert "internal_users" in str(env.error.cause)
    (row,) = lab_plant.events(invocation_id=env.invocation_id, kind="outcome")
    assert "collides with a row of internal_users" in row["cause_message"]  # private, audited


def test_integers_beyond_the_interoperable_range_are_invalid_input(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = lab_rt.invoke("orders.echo", {"n": 2**60}, actor=lab_plant.token())
    assert env.error is not None and env.error.code == "INPUT_INVALID"
    assert env.error.details == {
        "issues": [{"path": "/n", "message": "must be an integer within ±9007199254740991"}]
    }
    (row,) = lab_plant.events(invocation_id=env.invocation_id)
    assert row["status"] == "failed" and row["reason"] == "schema-violation"


def test_resuming_with_an_approval_that_is_not_bound_to_the_call_is_denied(
    lab_rt: warden.Runtime, lab_plant: Plant, lab: Lab
) -> None:
    token = lab_plant.token()
    suspended = lab_rt.invoke("orders.echo", {"n": 42}, actor=token)
    assert suspended.status == "suspended"
    for approval_id in ("no-such-approval", suspended.approval_id):
        other_actor = lab_plant.token(sub="mallory")
        env = lab_rt.invoke("orders.echo", {"n": 42}, actor=other_actor, approval_id=approval_id)
        assert env.status == "failed" and env.error is not None
        assert (env.error.code, env.error.stage) == ("APPROVAL_DENIED", "approval")
        assert env.error.details is None, "a mismatch reveals nothing about other approvals"
    pending = lab_rt.invoke(
        "orders.echo", {"n": 42}, actor=token, approval_id=suspended.approval_id
    )
    assert pending.status == "suspended" and pending.approval_id == suspended.approval_id
    assert lab.count("echo") == 0


def test_a_level_triggered_cancel_scope_cannot_cut_the_outcome_report_short(
    lab_plant: Plant, lab: Lab
) -> None:
    import anyio

    seen: list[warden.Envelope] = []

    async def scenario() -> None:
        rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab)
        try:
            await rt.aregister()
            # anyio cancels again at every await until the scope is left. The
            # scope is cancelled once the handler runs, however long the Begin took.
            scope = anyio.CancelScope()

            async def call() -> None:
                with scope:
                    seen.append(
                        await rt.ainvoke("orders.aslow", {"n": 150}, actor=lab_plant.token())
                    )

            async def cancel_once_running() -> None:
                while lab.count("aslow") == 0:
                    await anyio.sleep(0.002)
                scope.cancel()

            async with anyio.create_task_group() as calls:
                calls.start_soon(call)
                calls.start_soon(cancel_once_running)
        finally:
            await rt.aclose()
            rt.close()

    anyio.run(scenario)
    (env,) = seen
    assert env.status == "cancelled" and lab.count("aslow") == 1
    (row,) = lab_plant.events(invocation_id=env.invocation_id, kind="outcome")
    assert (row["status"], row["code"]) == ("cancelled", "CANCELLED")
