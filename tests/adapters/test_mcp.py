"""The MCP server against the real plane, through a real MCP client session
(protocol 2025-11-25) connected in memory: tools/list, and the exact JSON-RPC
message that answers tools/call for every status and every class of failure,
as golden files.

Regenerate with `pytest tests/adapters --update-golden` and review the diff.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

import warden
from tests.adapters import unreadable
from tests.adapters.cases import CASES, GOLDEN, Case, assert_real_approval, check_golden, normalised
from tests.adapters.conftest import actor_for, last_attempt, mcp_wire
from tests.adapters.lab import build_adapter_lab
from tests.conftest import ROOT, Plant
from tests.integration.lab import EchoIn, Lab
from warden_server.app import Server
from warden_server.auth.actors import mint_token

FOLDER = GOLDEN / "mcp"


def run(scenario: Any) -> Any:
    return asyncio.run(scenario())


def test_tools_list_matches_golden(
    adapter_rt: warden.Runtime, lab_plant: Plant, update_golden: bool
) -> None:
    async def scenario() -> tuple[list[Any], str]:
        async with mcp_wire(adapter_rt, actor=lab_plant.token()) as wire:
            tools = (await wire.session.list_tools()).tools
            return tools, await wire.list_tools()

    tools, line = run(scenario)
    # Hidden (orders.secret) and unexposed (orders.direct_only) are absent.
    assert [t.name for t in tools] == [
        "orders.admin",
        "orders.aslow",
        "orders.echo",
        "orders.mcp_only",
        "orders.profile",
        "orders.slow",
        "orders.wait",
    ]
    echo = next(t for t in tools if t.name == "orders.echo")
    assert echo.input_schema == EchoIn.model_json_schema()
    assert echo.annotations is not None and echo.annotations.read_only_hint is True
    check_golden(FOLDER / "tools-list.json", line, update_golden)


def test_tools_list_for_a_refused_actor_is_a_protocol_error(
    adapter_rt: warden.Runtime,
) -> None:
    async def scenario() -> MCPError:
        async with mcp_wire(adapter_rt, actor="not-a-jwt") as wire:
            with pytest.raises(MCPError) as raised:
                await wire.session.list_tools()
            return raised.value

    error = run(scenario)
    assert error.code == -32603
    assert error.data == {
        "code": "UNAUTHENTICATED",
        "message": "Authentication is required.",
        "retryable": False,
    }


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_call_matches_golden(
    case: Case, adapter_rt: warden.Runtime, lab_plant: Plant, update_golden: bool
) -> None:
    actor = actor_for(lab_plant, case)

    async def scenario() -> str:
        async with mcp_wire(adapter_rt, actor=lambda ctx: actor) as wire:
            return await wire.call(case.capability, case.arguments)

    line = run(scenario)
    message = json.loads(line)
    if case.model_code == "CAPABILITY_NOT_FOUND":
        assert message["error"]["code"] == -32602
        shape = message["error"]["data"]
    else:
        result = message["result"]
        assert result["isError"] is (case.model_code is not None)
        shape = result["structuredContent"]
        assert json.loads(result["content"][0]["text"]) == shape
    assert shape.get("code") == case.model_code
    if case.status == "suspended":
        assert_real_approval(shape, lab_plant.rows("SELECT approval_id FROM approvals"))
    row = last_attempt(lab_plant)
    assert (row["surface"], row["code"]) == ("mcp", case.recorded_code)
    check_golden(FOLDER / f"{case.name}.json", normalised(line, shape), update_golden)


def test_missing_arguments_are_validated_by_the_plane(
    adapter_rt: warden.Runtime, lab_plant: Plant
) -> None:
    async def scenario() -> Any:
        async with mcp_wire(adapter_rt, actor=lab_plant.token()) as wire:
            return await wire.session.call_tool("orders.echo", None)

    result = run(scenario)
    assert result.is_error
    assert result.structured_content["details"] == {
        "issues": [{"path": "/n", "message": "is required"}]
    }


def test_cancelled_by_the_service_matches_golden(
    adapter_rt: warden.Runtime, lab_plant: Plant, lab: Lab, update_golden: bool
) -> None:
    cancel = warden.CancelToken()

    async def scenario() -> str:
        async def cancel_once_running() -> None:
            while lab.count("wait") == 0:
                await anyio.sleep(0.005)
            cancel.cancel()

        async with (
            mcp_wire(adapter_rt, actor=lab_plant.token(), cancel=cancel) as wire,
            anyio.create_task_group() as tasks,
        ):
            tasks.start_soon(cancel_once_running)
            return await wire.call("orders.wait", {"n": 60000})

    line = run(scenario)
    assert json.loads(line)["result"]["isError"] is True
    row = last_attempt(lab_plant)
    assert (row["kind"], row["status"], row["surface"]) == ("outcome", "cancelled", "mcp")
    check_golden(FOLDER / "cancelled.json", line, update_golden)


def test_a_call_the_client_cancels_gets_no_answer_and_its_outcome_is_recorded(
    adapter_rt: warden.Runtime, lab_plant: Plant, lab: Lab
) -> None:
    async def scenario() -> tuple[list[str], dict[str, Any]]:
        async with mcp_wire(adapter_rt, actor=lab_plant.token()) as wire:
            with anyio.move_on_after(30) as scope:
                async with anyio.create_task_group() as tasks:

                    async def cancel_once_running() -> None:
                        while lab.count("wait") == 0:
                            await anyio.sleep(0.005)
                        scope.cancel()

                    tasks.start_soon(cancel_once_running)
                    await wire.session.call_tool("orders.wait", {"n": 60000})
            assert scope.cancelled_caught
            (request_id,) = [i for i, method in wire.requests if method == "tools/call"]
            # The report outlives the request; wait (boundedly) for it to land.
            with anyio.fail_after(10):
                while last_attempt(lab_plant)["kind"] != "outcome":
                    await anyio.sleep(0.01)
            # The session goes on: the next call is answered.
            after = await wire.session.call_tool("orders.echo", {"n": 1})
            assert after.structured_content == {"n": 1, "note": ""}
            unanswered = [m for m in wire.sent if json.loads(m).get("id") == request_id]
            return unanswered, last_outcome(lab_plant)

    unanswered, outcome = run(scenario)
    assert unanswered == []
    assert (outcome["status"], outcome["code"], outcome["surface"]) == (
        "cancelled",
        "CANCELLED",
        "mcp",
    )


def last_outcome(plant: Plant) -> dict[str, Any]:
    (row,) = plant.rows(
        "SELECT * FROM audit_events WHERE kind = 'outcome' AND status = 'cancelled' "
        "ORDER BY seq DESC LIMIT 1"
    )
    return row


def test_governance_unavailable_matches_golden(
    lab_plant: Plant, lab: Lab, update_golden: bool
) -> None:
    refused = build_adapter_lab(lab_plant.target, "not-a-service-token", lab)

    async def scenario() -> str:
        async with mcp_wire(refused, actor=lab_plant.token()) as wire:
            return await wire.call("orders.echo", {"n": 1})

    try:
        line = run(scenario)
    finally:
        refused.close()
    assert lab.count("echo") == 0
    check_golden(FOLDER / "governance-unavailable.json", line, update_golden)


def test_serve_stdio_serves_the_example_service_for_the_actor_in_its_environment(
    dev_plane: Server,
) -> None:
    actor = mint_token(
        dev_plane.plane.config, subject="bot-7", roles=("support",), tenant="acme", attrs={}
    )
    parameters = StdioServerParameters(
        command=sys.executable,
        args=[str(ROOT / "examples" / "orders" / "mcp_server.py")],
        env={
            **os.environ,
            "WARDEN_TARGET": dev_plane.target,
            "WARDEN_ACTOR_TOKEN": actor,
        },
    )

    async def scenario() -> tuple[list[str], Any, MCPError]:
        async with stdio_client(parameters) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = [t.name for t in (await session.list_tools()).tools]
            got = await session.call_tool("orders.get", {"order_id": "A1"})
            with pytest.raises(MCPError) as hidden:
                await session.call_tool("orders.export", {"since": "2026-01-01"})
            return names, got, hidden.value

    names, got, hidden = run(scenario)
    assert names == ["orders.get", "orders.refund"]
    assert got.structured_content == {"order_id": "A1", "total": 1250, "refundable": True}
    assert (hidden.code, hidden.message) == (-32602, "Unknown tool")


def test_serve_stdio_answers_a_line_that_is_not_a_message_as_json_rpc_says(
    dev_plane: Server,
) -> None:
    """The MCP SDK drops a line it cannot read, and the client waits for an
    answer that never comes; the adapter answers it (id null) and serves on.
    A lone surrogate escape is not JSON to the MCP SDK's parser."""
    actor = mint_token(
        dev_plane.plane.config, subject="bot-7", roles=("support",), tenant="acme", attrs={}
    )
    found = unreadable.answers(
        [sys.executable, str(ROOT / "examples" / "orders" / "mcp_server.py")],
        {**os.environ, "WARDEN_TARGET": dev_plane.target, "WARDEN_ACTOR_TOKEN": actor},
        "orders.get",
        '{"order_id":"A1"}',
    )
    assert unreadable.unreadable(found) == unreadable.EXPECTED
    assert found[-1]["result"]["structuredContent"]["order_id"] == "A1"
