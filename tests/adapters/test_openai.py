"""Function calling (OpenAI-style tools) against the real plane: the tool
definitions and the exact tool message content for every status and every
class of failure, as golden files.

Regenerate with `pytest tests/adapters --update-golden` and review the diff.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import warden
from tests.adapters.cases import (
    CASES,
    GOLDEN,
    Case,
    assert_real_approval,
    check_golden,
    normalised,
    pretty,
)
from tests.adapters.conftest import actor_for, last_attempt
from tests.adapters.lab import build_adapter_lab
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.lab import EchoIn, EchoOut, Lab
from warden.adapters import openai as warden_openai

FOLDER = GOLDEN / "openai"


def test_tool_definitions_match_golden(
    adapter_rt: warden.Runtime, lab_plant: Plant, update_golden: bool
) -> None:
    tools = warden_openai.tools(adapter_rt, actor=lab_plant.token())
    names = [t["function"]["name"] for t in tools]
    # Hidden (orders.secret) and unexposed (orders.direct_only, orders.mcp_only) are absent.
    assert names == [
        "orders-admin",
        "orders-aslow",
        "orders-echo",
        "orders-profile",
        "orders-slow",
        "orders-wait",
    ]
    echo = next(t for t in tools if t["function"]["name"] == "orders-echo")
    assert echo["function"]["parameters"] == EchoIn.model_json_schema()
    check_golden(FOLDER / "tools.json", pretty(tools), update_golden)


def test_the_admin_is_offered_what_is_hidden_from_others(
    adapter_rt: warden.Runtime, lab_plant: Plant
) -> None:
    tools = warden_openai.tools(adapter_rt, actor=lab_plant.token(roles=("admin",)))
    assert "orders-secret" in [t["function"]["name"] for t in tools]


@given(st.from_regex(r"\A[a-z][a-z0-9_]{0,8}(\.[a-z][a-z0-9_]{0,8}){1,3}\Z"))
def test_function_names_reverse_to_capability_ids_exactly(capability_id: str) -> None:
    name = warden_openai.tool_name(capability_id)
    assert all(c.isalnum() or c in "_-" for c in name)
    assert warden_openai.capability_id(name) == capability_id


def test_ids_too_long_for_a_function_name_are_not_offered(lab_plant: Plant) -> None:
    long_id = "orders." + "x" * 60
    rt = warden.Runtime(lab_plant.target, service="orders", token=ORDERS_TOKEN)

    @rt.capability(long_id, input=EchoIn, output=EchoOut, side_effect="read")
    def long(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        return EchoOut(n=inp.n)

    @rt.capability("orders.short", input=EchoIn, output=EchoOut, side_effect="read")
    def short(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        return EchoOut(n=inp.n)

    try:
        names = [t["function"]["name"] for t in warden_openai.tools(rt, actor=lab_plant.token())]
    finally:
        rt.close()
    assert names == ["orders-short"]


def test_tools_for_a_refused_actor_raise_the_model_safe_error(
    adapter_rt: warden.Runtime,
) -> None:
    with pytest.raises(warden.CapabilityError) as raised:
        warden_openai.tools(adapter_rt, actor="not-a-jwt")
    assert raised.value.to_model() == {
        "code": "UNAUTHENTICATED",
        "message": "Authentication is required.",
        "retryable": False,
    }


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_call_content_matches_golden(
    case: Case, adapter_rt: warden.Runtime, lab_plant: Plant, update_golden: bool
) -> None:
    content = warden_openai.call(
        adapter_rt,
        warden_openai.tool_name(case.capability),
        json.dumps(case.arguments),
        actor=actor_for(lab_plant, case),
    )
    shape = json.loads(content)
    if case.model_code is None:
        assert "code" not in shape
    else:
        assert shape["code"] == case.model_code
    if case.status == "suspended":
        assert_real_approval(shape, lab_plant.rows("SELECT approval_id FROM approvals"))
    row = last_attempt(lab_plant)
    assert (row["surface"], row["code"]) == ("openai", case.recorded_code)
    check_golden(FOLDER / f"{case.name}.json", normalised(content, shape), update_golden)


@pytest.mark.parametrize("arguments", ['{"n": 1', "", "n=1", '{"n": NaN}'])
def test_unparsable_arguments_reach_the_plane_and_fail_at_the_adapter_stage(
    arguments: str, adapter_rt: warden.Runtime, lab_plant: Plant, lab: Lab, update_golden: bool
) -> None:
    content = warden_openai.call(adapter_rt, "orders-echo", arguments, actor=lab_plant.token())
    row = last_attempt(lab_plant)
    assert (row["kind"], row["code"], row["stage"]) == ("decision", "INPUT_INVALID", "adapter")
    assert row["surface"] == "openai"
    assert lab.count("echo") == 0
    check_golden(FOLDER / "input-unparsable.json", content, update_golden)


def test_cancelled_content_matches_golden(
    adapter_rt: warden.Runtime, lab_plant: Plant, lab: Lab, update_golden: bool
) -> None:
    cancel = warden.CancelToken()

    async def scenario() -> str:
        call = asyncio.create_task(
            warden_openai.acall(
                adapter_rt, "orders-wait", '{"n": 60000}', actor=lab_plant.token(), cancel=cancel
            )
        )
        while lab.count("wait") == 0:
            await asyncio.sleep(0.005)
        cancel.cancel()
        try:
            return await call
        finally:
            await adapter_rt.aclose()

    content = asyncio.run(scenario())
    row = last_attempt(lab_plant)
    assert (row["kind"], row["status"], row["surface"]) == ("outcome", "cancelled", "openai")
    check_golden(FOLDER / "cancelled.json", content, update_golden)


def test_governance_unavailable_content_matches_golden(
    lab_plant: Plant, lab: Lab, update_golden: bool
) -> None:
    refused = build_adapter_lab(lab_plant.target, "not-a-service-token", lab)
    try:
        content = warden_openai.call(refused, "orders-echo", '{"n": 1}', actor=lab_plant.token())
    finally:
        refused.close()
    assert lab.count("echo") == 0
    check_golden(FOLDER / "governance-unavailable.json", content, update_golden)
