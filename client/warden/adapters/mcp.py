"""An MCP server (specification 2025-11-25) for a service's capabilities.

``tools/list`` is what discovery shows the connected actor on the ``mcp``
surface; ``tools/call`` invokes through the ``Runtime``. A tool's name is its
capability id (MCP tool names allow dots). The translation of every status
is in ``docs/reference/adapters.md``:

- the concealment class (unknown id, unexposed surface, hidden by policy)
  answers the JSON-RPC protocol error for an unknown tool, ``-32602``,
  identical for all three (SI-8);
- every other outcome is a tool result whose structured content, and text
  content as JSON, is the output without its model-hidden fields, or the
  model-safe error shape with ``isError: true``.

Over stdio the MCP host starts the service's process, so the actor is the
process's: read its JWT from the environment the host sets, e.g.::

    warden.adapters.mcp.serve_stdio(rt, actor=os.environ["WARDEN_ACTOR_TOKEN"])

``actor`` may instead be a function of the request's context that returns a
JWT: a token refreshed before it expires, or, behind streamable HTTP
(``build_server(...).streamable_http_app()``), the caller's own bearer token.

Needs the ``mcp`` package: the SDK's extra ``warden[mcp]`` (from a checkout,
``pip install './client[mcp]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeAlias

try:
    import anyio
    import anyio.abc
    from mcp import types
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import SessionMessage
    from pydantic import ValidationError
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "warden.adapters.mcp needs the mcp package: install the SDK with its extra, "
        "warden[mcp] (from a checkout: pip install './client[mcp]')"
    ) from exc

if TYPE_CHECKING:
    from mcp.shared._stream_protocols import ReadStream, WriteStream

from warden._cancel import CancelToken
from warden._capability import DiscoveredCapability
from warden._envelope import Envelope
from warden._errors import CapabilityError
from warden._runtime import Runtime
from warden.adapters._translate import ADAPTER_FAILURE, ModelAnswer, answer, refusal

SURFACE: Final = "mcp"
UNKNOWN_TOOL: Final = "Unknown tool"
"""The protocol error's message for the concealment class: the same for every
tool, so that it cannot tell one hidden case from another."""

RequestContext: TypeAlias = ServerRequestContext[Any, Any]
ActorSource: TypeAlias = str | Callable[[RequestContext], str]
"""An actor's JWT, or a function of the request's context that returns one."""

log = logging.getLogger("warden.adapters.mcp")


def build_server(
    runtime: Runtime,
    *,
    actor: ActorSource,
    context: Mapping[str, Any] | None = None,
    cancel: CancelToken | None = None,
    name: str | None = None,
    version: str = "",
) -> Server[Any]:
    """An MCP server offering the runtime's capabilities to the actor ``actor`` names.

    Args:
        runtime: The service's runtime; calls run its handlers.
        actor: The actor's JWT, or a function of the request's context that
            returns it (called for every request).
        context: Attributes for policies (``context`` in CEL); the plane
            adds ``surface``.
        cancel: A token that cancels every call in progress, and every later
            one, when the service shuts down: they answer ``CANCELLED``. (A
            call the client cancels gets no answer at all, as MCP requires;
            its outcome is recorded all the same.)
        name: The server's name (the service's name by default).
        version: The server's version, as ``serverInfo`` reports it.

    Returns:
        A server for any MCP transport: ``serve_stdio`` runs it over stdio.
    """

    async def list_tools(
        ctx: RequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            discovered = await runtime.adiscover(
                actor=_actor_of(actor, ctx), surface=SURFACE, context=context
            )
        except CapabilityError as error:
            # Discovery itself was refused: no list can be answered.
            raise _protocol_error(types.INTERNAL_ERROR, refusal(error)) from None
        except Exception:
            log.exception("tools/list could not be answered")
            raise _protocol_error(types.INTERNAL_ERROR, ADAPTER_FAILURE) from None
        served = runtime.capabilities
        return types.ListToolsResult(tools=[_tool(c) for c in discovered if c.id in served])

    async def call_tool(
        ctx: RequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            envelope = await _invoke_to_the_end(
                runtime.ainvoke(
                    params.name,
                    params.arguments if params.arguments is not None else {},
                    actor=_actor_of(actor, ctx),
                    context=context,
                    surface=SURFACE,
                    cancel=cancel,
                )
            )
            result = answer(envelope)
        except Exception:
            # The SDK would put an exception's text on the wire: never let one out.
            log.exception("tools/call %r could not be translated", params.name)
            result = ADAPTER_FAILURE
        if result.conceals_capability:
            raise _protocol_error(types.INVALID_PARAMS, result, message=UNKNOWN_TOOL)
        return _tool_result(result)

    return Server(
        name or runtime.service,
        version=version,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def aserve_stdio(
    runtime: Runtime,
    *,
    actor: ActorSource,
    context: Mapping[str, Any] | None = None,
    cancel: CancelToken | None = None,
    name: str | None = None,
    version: str = "",
) -> None:
    """Serve the runtime's capabilities over stdio until the client closes it.

    See ``build_server`` for the arguments.
    """
    server = build_server(
        runtime, actor=actor, context=context, cancel=cancel, name=name, version=version
    )
    try:
        async with stdio_server() as (read_stream, write_stream):
            relayed, received = anyio.create_memory_object_stream[SessionMessage | Exception](0)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(_answer_unreadable, read_stream, relayed, write_stream)
                await server.run(received, write_stream, server.create_initialization_options())
    finally:
        await runtime.aclose()


async def _answer_unreadable(
    read_stream: ReadStream[SessionMessage | Exception],
    relayed: anyio.abc.ObjectSendStream[SessionMessage | Exception],
    write_stream: WriteStream[SessionMessage],
) -> None:
    """Relay the client's messages to the server, answering each line that is
    not one as JSON-RPC 2.0 says (the MCP SDK drops it, and the client waits
    for an answer that never comes): ``-32700`` for text that is not JSON
    (a lone surrogate escape is not, to its parser), ``-32600`` for JSON that
    is not a message; ``id`` null, since none could be read."""
    async with relayed:
        async for item in read_stream:
            if not isinstance(item, Exception):
                await relayed.send(item)
                continue
            unparsable = isinstance(item, ValidationError) and any(
                e["type"] == "json_invalid" for e in item.errors()
            )
            code, message = (
                (types.PARSE_ERROR, "Parse error")
                if unparsable
                else (types.INVALID_REQUEST, "Invalid Request")
            )
            error = types.JSONRPCError(
                jsonrpc="2.0", id=None, error=types.ErrorData(code=code, message=message)
            )
            await write_stream.send(SessionMessage(error))


def serve_stdio(
    runtime: Runtime,
    *,
    actor: ActorSource,
    context: Mapping[str, Any] | None = None,
    cancel: CancelToken | None = None,
    name: str | None = None,
    version: str = "",
) -> None:
    """Serve the runtime's capabilities over stdio; blocks until the client closes it.

    See ``build_server`` for the arguments.
    """
    asyncio.run(
        aserve_stdio(
            runtime, actor=actor, context=context, cancel=cancel, name=name, version=version
        )
    )


async def _invoke_to_the_end(invocation: Coroutine[Any, Any, Envelope]) -> Envelope:
    """Await an invocation so that a request the client cancels gets no answer,
    as MCP requires, while the invocation still ends as ``cancelled`` and
    reports its outcome.

    The MCP SDK cancels a request's handler through an anyio cancel scope. The
    runtime absorbs that scope's repeated cancellations until the outcome is
    reported; here the wait is shielded the same way, and the cancellation is
    raised again afterwards so the SDK drops the answer.
    """
    task = asyncio.ensure_future(invocation)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.cancel()
        with anyio.CancelScope(shield=True), contextlib.suppress(asyncio.CancelledError):
            await task
        raise


def _actor_of(actor: ActorSource, ctx: RequestContext) -> str:
    return actor if isinstance(actor, str) else actor(ctx)


def _tool(capability: DiscoveredCapability) -> types.Tool:
    read = capability.side_effect == "read"
    return types.Tool(
        name=capability.id,
        description=capability.description or None,
        input_schema=capability.input_schema,
        annotations=types.ToolAnnotations(
            read_only_hint=read,
            idempotent_hint=None if read else capability.side_effect == "idempotent",
        ),
    )


def _tool_result(result: ModelAnswer) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=result.text)],
        # Structured content must be an object; an output hidden whole is null.
        structured_content=result.value if isinstance(result.value, dict) else None,
        is_error=result.is_error,
    )


def _protocol_error(code: int, result: ModelAnswer, *, message: str | None = None) -> MCPError:
    return MCPError(code=code, message=message or result.value["message"], data=result.value)
