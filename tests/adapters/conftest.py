"""Fixtures for the adapters: the adapter lab on the real plane, and a real MCP
client session connected in memory to an adapter's server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.memory import create_client_server_memory_streams
from mcp.shared.message import SessionMessage

import warden
from tests.adapters.cases import Case
from tests.adapters.lab import build_adapter_lab
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.lab import Lab
from warden.adapters import mcp as warden_mcp
from warden.adapters import openai as warden_openai


@pytest.fixture
def adapter_rt(lab_plant: Plant, lab: Lab) -> Iterator[warden.Runtime]:
    rt = build_adapter_lab(lab_plant.target, ORDERS_TOKEN, lab)
    rt.register()
    yield rt
    rt.close()


def actor_for(plant: Plant, case: Case) -> str:
    return plant.token(roles=case.roles) if case.authenticated else ""


def last_attempt(plant: Plant) -> dict[str, Any]:
    """The newest decision or outcome record: what the plane says happened."""
    (row,) = plant.rows(
        "SELECT * FROM audit_events WHERE kind IN ('decision', 'outcome') ORDER BY seq DESC LIMIT 1"
    )
    return row


class McpWire:
    """A client session to an adapter's server, and every JSON-RPC message the
    server wrote, serialized as the stdio transport writes them."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session
        self.sent: list[str] = []
        self.requests: list[tuple[Any, str]] = []

    def response_to(self, request_id: Any) -> str:
        (line,) = [m for m in self.sent if m.startswith(f'{{"jsonrpc":"2.0","id":{request_id},')]
        return line

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """tools/call, answered by a result or an error: the exact line, with
        the request's id (which counts the session's requests) normalised."""
        with contextlib.suppress(MCPError):
            await self.session.call_tool(name, arguments)
        request_id = [i for i, method in self.requests if method == "tools/call"][-1]
        return self.normalise_id(self.response_to(request_id), request_id)

    async def list_tools(self) -> str:
        await self.session.list_tools()
        request_id = [i for i, method in self.requests if method == "tools/list"][-1]
        return self.normalise_id(self.response_to(request_id), request_id)

    @staticmethod
    def normalise_id(line: str, request_id: Any) -> str:
        prefix = f'{{"jsonrpc":"2.0","id":{request_id},'
        assert line.startswith(prefix)
        return '{"jsonrpc":"2.0","id":"<request-id>",' + line.removeprefix(prefix)


@contextlib.asynccontextmanager
async def mcp_wire(runtime: warden.Runtime, **server: Any) -> AsyncIterator[McpWire]:
    """A real MCP client session (protocol 2025-11-25) to ``build_server(runtime, **server)``."""
    built = warden_mcp.build_server(runtime, **server)
    async with create_client_server_memory_streams() as (client, (server_read, server_write)):
        to_client_send, to_client_receive = anyio.create_memory_object_stream[SessionMessage](0)
        to_server_send, to_server_receive = anyio.create_memory_object_stream[
            SessionMessage | Exception
        ](0)
        session = ClientSession(*client)
        wire = McpWire(session)

        async def server_out(
            source: ObjectReceiveStream[SessionMessage], sink: ObjectSendStream[Any]
        ) -> None:
            async with source, sink:
                async for message in source:
                    wire.sent.append(
                        message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    )
                    await sink.send(message)

        async def server_in(source: ObjectReceiveStream[Any], sink: ObjectSendStream[Any]) -> None:
            async with source, sink:
                async for message in source:
                    if isinstance(message, SessionMessage):
                        payload = message.message.model_dump(by_alias=True, exclude_unset=True)
                        if "method" in payload and "id" in payload:
                            wire.requests.append((payload["id"], payload["method"]))
                    await sink.send(message)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(server_out, to_client_receive, server_write)
            tasks.start_soon(server_in, server_read, to_server_send)
            tasks.start_soon(
                built.run, to_server_receive, to_client_send, built.create_initialization_options()
            )
            try:
                async with session:
                    result = await session.initialize()
                    assert result.protocol_version == "2025-11-25"
                    yield wire
            finally:
                tasks.cancel_scope.cancel()
                await runtime.aclose()


Call = tuple[str, dict[str, Any], str]
"""A capability id, its arguments and the actor's JWT."""


def through_both_adapters(runtime: warden.Runtime, calls: list[Call]) -> dict[str, list[str]]:
    """What each adapter writes for each call: the function-calling tool message
    content, and the MCP server's answer to tools/call (its request id normalised)."""
    contents = [
        warden_openai.call(runtime, warden_openai.tool_name(c), json.dumps(a), actor=actor)
        for c, a, actor in calls
    ]
    current = {"actor": ""}

    async def scenario() -> list[str]:
        async with mcp_wire(runtime, actor=lambda ctx: current["actor"]) as wire:
            lines = []
            for capability, arguments, actor in calls:
                current["actor"] = actor
                lines.append(await wire.call(capability, arguments))
            return lines

    return {"openai": contents, "mcp": asyncio.run(scenario())}
