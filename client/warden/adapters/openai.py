"""Function calling (OpenAI-style tools) for a service's capabilities.

``tools`` turns what discovery shows an actor on the ``openai`` surface into
tool definitions; ``call`` takes a tool call as the model produced it (the
function's name and its arguments as JSON text) and returns the content of
the tool message, a JSON string::

    from warden.adapters import openai as warden_tools

    tools = warden_tools.tools(rt, actor=ACTOR_JWT)
    # ... the model answers with a tool call ...
    content = warden_tools.call(rt, call.function.name, call.function.arguments,
                                actor=ACTOR_JWT)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": content})

Function names allow only ``[A-Za-z0-9_-]``, so a capability id's dots become
hyphens, which ids never contain: ``orders.refund`` is the function
``orders-refund``, and the mapping reverses exactly (``tool_name`` and
``capability_id``). An id longer than 64 characters cannot be a function
name and is left out of ``tools``.

The content is, for every status, what ``docs/reference/adapters.md`` shows:
the output without its model-hidden fields, or the model-safe error shape.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from warden._cancel import CancelToken
from warden._capability import DiscoveredCapability
from warden._runtime import Runtime
from warden.adapters._translate import answer

SURFACE: Final = "openai"
MAX_NAME_LENGTH: Final = 64
"""The longest function name the API accepts."""

log = logging.getLogger("warden.adapters.openai")


def tool_name(capability_id: str) -> str:
    """The function name of a capability: ``orders.refund`` -> ``orders-refund``."""
    return capability_id.replace(".", "-")


def capability_id(tool_name: str) -> str:
    """The capability a function name stands for: ``orders-refund`` -> ``orders.refund``."""
    return tool_name.replace("-", ".")


def tools(
    runtime: Runtime, *, actor: str | None, context: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The tool definitions an actor may see; see ``atools``."""
    return _definitions(runtime, runtime.discover(actor=actor, surface=SURFACE, context=context))


async def atools(
    runtime: Runtime, *, actor: str | None, context: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The tool definitions (Chat Completions format) an actor may see.

    One per capability this runtime serves that discovery shows the actor on
    the ``openai`` surface: ``{"type": "function", "function": {"name",
    "description", "parameters"}}``, the parameters being the registered
    input schema. Unexposed and hidden capabilities are absent.

    Raises:
        CapabilityError: the plane refused the actor (UNAUTHENTICATED) or
            could not be asked (GOVERNANCE_UNAVAILABLE); ``to_model()`` is
            its face for a model.
    """
    discovered = await runtime.adiscover(actor=actor, surface=SURFACE, context=context)
    return _definitions(runtime, discovered)


def call(
    runtime: Runtime,
    name: str,
    arguments: str,
    *,
    actor: str | None,
    context: Mapping[str, Any] | None = None,
    cancel: CancelToken | None = None,
) -> str:
    """The tool message content for a tool call; see ``acall``."""
    envelope = runtime.invoke(
        capability_id(name),
        arguments,
        actor=actor,
        context=context,
        surface=SURFACE,
        cancel=cancel,
    )
    return answer(envelope).text


async def acall(
    runtime: Runtime,
    name: str,
    arguments: str,
    *,
    actor: str | None,
    context: Mapping[str, Any] | None = None,
    cancel: CancelToken | None = None,
) -> str:
    """Invoke the capability a tool call names and answer with the tool message content.

    Every call reaches the plane and is audited, whatever its name or
    arguments: a name that is not a capability this actor may see on the
    ``openai`` surface answers ``CAPABILITY_NOT_FOUND``, and argument text
    that is not JSON answers ``INPUT_INVALID`` (stage ``adapter``).

    Args:
        runtime: The service's runtime.
        name: The function name, as the model produced it.
        arguments: The arguments as JSON text, as the model produced them.
        actor: The actor's JWT.
        context: Attributes for policies (``context`` in CEL).
        cancel: A token that cancels the call from any thread.

    Returns:
        Compact, key-sorted JSON: the output without its model-hidden fields
        when the call succeeded, otherwise the error's model-safe shape
        (``APPROVAL_REQUIRED`` with the approval's id and expiry when
        suspended, ``CANCELLED`` when cancelled).
    """
    envelope = await runtime.ainvoke(
        capability_id(name),
        arguments,
        actor=actor,
        context=context,
        surface=SURFACE,
        cancel=cancel,
    )
    return answer(envelope).text


def _definitions(runtime: Runtime, discovered: list[DiscoveredCapability]) -> list[dict[str, Any]]:
    served = runtime.capabilities
    definitions = []
    for capability in discovered:
        if capability.id not in served:
            continue
        name = tool_name(capability.id)
        if len(name) > MAX_NAME_LENGTH:
            log.warning(
                "%s is not offered as a tool: its function name would be longer than %d",
                capability.id,
                MAX_NAME_LENGTH,
            )
            continue
        function: dict[str, Any] = {"name": name}
        if capability.description:
            function["description"] = capability.description
        function["parameters"] = capability.input_schema
        definitions.append({"type": "function", "function": function})
    return definitions
