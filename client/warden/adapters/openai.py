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

With ``strict=True``, ``tools`` gives definitions for OpenAI's strict mode
(Structured Outputs): ``"strict": true``, every object closed with
``"additionalProperties": false``, every property required and the optional
ones nullable (``strict_schema``); ``call(..., strict=True)`` takes the nulls a
model writes for optional properties as absent (``strict_arguments``), so the
plane validates the arguments against the schema the capability registered.

Function names allow only ``[A-Za-z0-9_-]``, so a capability id's dots become
hyphens, which ids never contain: ``orders.refund`` is the function
``orders-refund``, and the mapping reverses exactly (``tool_name`` and
``capability_id``). An id longer than 64 characters cannot be a function
name and is left out of ``tools``.

The content is, for every status, what ``docs/reference/adapters.md`` shows:
the output without its model-hidden fields, or the model-safe error shape.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final, cast

from warden._cancel import CancelToken
from warden._capability import DiscoveredCapability
from warden._runtime import Runtime
from warden.adapters._translate import answer
from warden.shared.canonical import strict_loads

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
    runtime: Runtime,
    *,
    actor: str | None,
    context: Mapping[str, Any] | None = None,
    strict: bool = False,
) -> list[dict[str, Any]]:
    """The tool definitions an actor may see; see ``atools``."""
    discovered = runtime.discover(actor=actor, surface=SURFACE, context=context)
    return _definitions(runtime, discovered, strict)


async def atools(
    runtime: Runtime,
    *,
    actor: str | None,
    context: Mapping[str, Any] | None = None,
    strict: bool = False,
) -> list[dict[str, Any]]:
    """The tool definitions (Chat Completions format) an actor may see.

    One per capability this runtime serves that discovery shows the actor on
    the ``openai`` surface: ``{"type": "function", "function": {"name",
    "description", "parameters"}}``, the parameters being the registered
    input schema. Unexposed and hidden capabilities are absent.

    With ``strict`` each definition is for OpenAI's strict mode: ``"strict":
    true`` and the parameters ``strict_schema`` makes of the input schema.

    Raises:
        CapabilityError: the plane refused the actor (UNAUTHENTICATED) or
            could not be asked (GOVERNANCE_UNAVAILABLE); ``to_model()`` is
            its face for a model.
    """
    discovered = await runtime.adiscover(actor=actor, surface=SURFACE, context=context)
    return _definitions(runtime, discovered, strict)


def call(
    runtime: Runtime,
    name: str,
    arguments: str,
    *,
    actor: str | None,
    context: Mapping[str, Any] | None = None,
    cancel: CancelToken | None = None,
    strict: bool = False,
) -> str:
    """The tool message content for a tool call; see ``acall``."""
    envelope = runtime.invoke(
        capability_id(name),
        _arguments(runtime, name, arguments, strict),
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
    strict: bool = False,
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
        strict: The tools were offered with ``strict=True``: nulls for
            optional properties are taken as absent (``strict_arguments``).

    Returns:
        Compact, key-sorted JSON: the output without its model-hidden fields
        when the call succeeded, otherwise the error's model-safe shape
        (``APPROVAL_REQUIRED`` with the approval's id and expiry when
        suspended, ``CANCELLED`` when cancelled).
    """
    envelope = await runtime.ainvoke(
        capability_id(name),
        _arguments(runtime, name, arguments, strict),
        actor=actor,
        context=context,
        surface=SURFACE,
        cancel=cancel,
    )
    return answer(envelope).text


def _definitions(
    runtime: Runtime, discovered: list[DiscoveredCapability], strict: bool
) -> list[dict[str, Any]]:
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
        if strict:
            function["parameters"] = strict_schema(capability.input_schema)
            function["strict"] = True
        else:
            function["parameters"] = capability.input_schema
        definitions.append({"type": "function", "function": function})
    return definitions


def _arguments(runtime: Runtime, name: str, arguments: str, strict: bool) -> str:
    spec = runtime.capabilities.get(capability_id(name))
    if not strict or spec is None:
        return arguments
    return strict_arguments(arguments, spec.input_schema)


UNSUPPORTED: Final = frozenset({"default", "title", "$schema"})
"""Keywords strict mode refuses. They stay in the registered schema, which the
plane checks the arguments against."""
SCHEMA_MAPS: Final = frozenset({"properties", "$defs", "definitions", "patternProperties"})
"""Keywords whose value maps names to schemas (the names are not keywords)."""
VALUES: Final = frozenset({"const", "enum", "examples", "required"})
"""Keywords whose value is data, not a schema."""


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON Schema in the form OpenAI's strict mode accepts: every object
    closed (``"additionalProperties": false``) with every property required,
    the optional ones made nullable; ``default``, ``title`` and ``$schema``
    left out. The schema given is not changed.
    """
    return cast(dict[str, Any], _strict_node(schema))


def _strict_node(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict_node(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in UNSUPPORTED:
            continue
        if key in SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: _strict_node(item) for name, item in value.items()}
        elif key in VALUES:
            out[key] = value
        else:
            out[key] = _strict_node(value)
    if node.get("type") == "object" or "properties" in node:
        properties: dict[str, Any] = out.get("properties", {})
        required = set(node.get("required", ()))
        out["properties"] = {
            name: schema if name in required else _nullable(schema)
            for name, schema in properties.items()
        }
        out["required"] = list(properties)
        out["additionalProperties"] = False
    return out


def _nullable(schema: Any) -> Any:
    if not isinstance(schema, Mapping):
        return schema
    kind = schema.get("type")
    if isinstance(kind, str) and "enum" not in schema and "const" not in schema:
        return schema if kind == "null" else {**schema, "type": [kind, "null"]}
    if isinstance(kind, list):
        return schema if "null" in kind else {**schema, "type": [*kind, "null"]}
    if {"type": "null"} in schema.get("anyOf", ()):
        return schema
    return {"anyOf": [schema, {"type": "null"}]}


def strict_arguments(arguments: str, schema: Mapping[str, Any]) -> str:
    """The arguments a strict-mode model wrote, with the nulls it had to write
    for optional properties taken out, at any depth (through ``$ref``,
    ``anyOf`` and array items). Text that is not JSON is returned as it is,
    for the plane to answer and record; so is text without such nulls.
    """
    try:
        value = strict_loads(arguments)
    except ValueError:
        return arguments
    cleaned = _drop_nulls(value, schema, schema)
    return arguments if cleaned == value else json.dumps(cleaned, ensure_ascii=False)


def _drop_nulls(value: Any, schema: Any, root: Mapping[str, Any]) -> Any:
    if isinstance(value, list):
        items = _resolve(schema, root).get("items")
        return [_drop_nulls(item, _branch(item, items, root), root) for item in value]
    if not isinstance(value, dict):
        return value
    node = _branch(value, schema, root)
    properties = node.get("properties", {})
    required = set(node.get("required", ()))
    return {
        key: _drop_nulls(item, properties.get(key), root)
        for key, item in value.items()
        if not (item is None and key in properties and key not in required)
    }


def _resolve(schema: Any, root: Mapping[str, Any]) -> Mapping[str, Any]:
    """A schema with its local references (``#/$defs/Name``) followed."""
    for _ in range(32):  # a chain of references, bounded
        ref = schema.get("$ref") if isinstance(schema, Mapping) else None
        if not isinstance(ref, str) or not ref.startswith("#"):
            break
        target: Any = root
        for part in filter(None, ref[1:].split("/")):
            name = part.replace("~1", "/").replace("~0", "~")
            target = target.get(name) if isinstance(target, Mapping) else None
        schema = target
    return schema if isinstance(schema, Mapping) else {}


def _branch(value: Any, schema: Any, root: Mapping[str, Any]) -> Mapping[str, Any]:
    """The schema a value is read by: the first ``anyOf``/``oneOf`` branch of its kind."""
    node = _resolve(schema, root)
    kind = "object" if isinstance(value, dict) else "array" if isinstance(value, list) else None
    for option in (*node.get("anyOf", ()), *node.get("oneOf", ())):
        branch = _resolve(option, root)
        if branch.get("type") == kind or (kind == "object" and "properties" in branch):
            return branch
    return node
