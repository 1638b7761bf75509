"""A capability as the SDK holds it: the handler, its models, its definition."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from warden._context import Authorizer, DeclaredError
from warden._errors import WardenError
from warden.shared.canonical import compact_json
from warden.shared.redaction import sensitive_texts
from warden.shared.schema import (
    MODEL_VISIBLE,
    SENSITIVE,
    SchemaValidator,
    compile_validator,
    marks_anything,
    strip_model_hidden,
)
from warden.v1 import registry_pb2

SideEffect = Literal["read", "write", "idempotent"]
SURFACES = ("mcp", "openai", "direct")
_SIDE_EFFECTS = {
    "read": registry_pb2.SIDE_EFFECT_READ,
    "write": registry_pb2.SIDE_EFFECT_WRITE,
    "idempotent": registry_pb2.SIDE_EFFECT_IDEMPOTENT,
}
_SIDE_EFFECT_NAMES: dict[int, SideEffect] = {
    registry_pb2.SIDE_EFFECT_READ: "read",
    registry_pb2.SIDE_EFFECT_WRITE: "write",
    registry_pb2.SIDE_EFFECT_IDEMPOTENT: "idempotent",
}
_ID = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")

ErrorSpec = str | DeclaredError | Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class CapabilitySpec:
    """A capability registered with a Runtime."""

    id: str
    handler: Callable[..., Any]
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    side_effect: SideEffect
    errors: Mapping[str, DeclaredError]
    timeout_ms: int | None
    exposure: tuple[str, ...]
    required_roles: tuple[str, ...]
    tags: tuple[str, ...]
    description: str
    version: str | None
    input_schema: dict[str, Any] = field(repr=False)
    output_schema: dict[str, Any] = field(repr=False)
    output_validator: SchemaValidator = field(repr=False, compare=False)
    authorize: Authorizer | None = field(default=None, repr=False, compare=False)
    input_marks_sensitive: bool = field(default=True, repr=False, compare=False)
    output_marks_sensitive: bool = field(default=True, repr=False, compare=False)
    output_marks_hidden: bool = field(default=True, repr=False, compare=False)
    """Whether the schemas mark anything (SI-5): when they do not, no value
    has a marked field, and the walks that find them are skipped."""

    def input_secrets(self, input_json: str) -> frozenset[str]:
        """The sensitive texts of an input (``sensitive_texts``), given as JSON text."""
        if not self.input_marks_sensitive:
            return frozenset()
        return sensitive_texts(json.loads(input_json), self.input_schema)

    def output_secrets(self, value: Any) -> frozenset[str]:
        """The sensitive texts of an output value (``sensitive_texts``)."""
        if not self.output_marks_sensitive:
            return frozenset()
        return sensitive_texts(value, self.output_schema)

    def model_output(self, value: Any) -> Any:
        """The output as a model may see it (``strip_model_hidden``): a copy
        without the hidden fields, or the value itself when none is marked."""
        if not self.output_marks_hidden:
            return value
        return strip_model_hidden(value, self.output_schema)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.handler)

    def to_proto(self) -> registry_pb2.CapabilityDefinition:
        return registry_pb2.CapabilityDefinition(
            id=self.id,
            version=self.version or "",
            description=self.description,
            input_schema_json=compact_json(self.input_schema),
            output_schema_json=compact_json(self.output_schema),
            errors=[
                registry_pb2.DeclaredError(code=e.code, message=e.message, retryable=e.retryable)
                for e in self.errors.values()
            ],
            side_effect=_SIDE_EFFECTS[self.side_effect],
            timeout_ms=self.timeout_ms or 0,
            exposure=list(self.exposure),
            required_roles=list(self.required_roles),
            tags=list(self.tags),
        )


def build_spec(
    capability_id: str,
    handler: Callable[..., Any],
    *,
    input: type[BaseModel],
    output: type[BaseModel],
    side_effect: SideEffect,
    errors: Mapping[str, ErrorSpec] | None,
    timeout_ms: int | None,
    exposure: Sequence[str] | None,
    required_roles: Sequence[str],
    tags: Sequence[str],
    description: str | None,
    version: str | None,
    authorize: Authorizer | None = None,
) -> CapabilitySpec:
    """Check a decorated definition and derive its JSON Schemas.

    Raises:
        WardenError: the definition is unusable (the message says why).
    """
    where = f"capability {capability_id!r}"
    if not _ID.match(capability_id):
        raise WardenError(f"{where}: id must be namespace.name, lowercase, dot separated")
    for name, model in (("input", input), ("output", output)):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise WardenError(f"{where}: {name}= must be a pydantic model class")
    if side_effect not in _SIDE_EFFECTS:
        raise WardenError(f"{where}: side_effect must be read, write or idempotent")
    surfaces = tuple(exposure) if exposure is not None else SURFACES
    unknown = sorted(set(surfaces) - set(SURFACES))
    if unknown:
        raise WardenError(f"{where}: unknown surfaces {unknown}; known: {', '.join(SURFACES)}")
    if timeout_ms is not None and timeout_ms <= 0:
        raise WardenError(f"{where}: timeout_ms must be positive")
    input_schema = input.model_json_schema(mode="validation")
    output_schema = output.model_json_schema(mode="serialization")
    return CapabilitySpec(
        id=capability_id,
        handler=handler,
        input_model=input,
        output_model=output,
        side_effect=side_effect,
        errors={code: _declared(code, spec) for code, spec in (errors or {}).items()},
        timeout_ms=timeout_ms,
        exposure=surfaces,
        required_roles=tuple(required_roles),
        tags=tuple(tags),
        description=description or inspect.getdoc(handler) or "",
        version=version,
        input_schema=input_schema,
        output_schema=output_schema,
        output_validator=compile_validator(output_schema),
        authorize=authorize,
        input_marks_sensitive=marks_anything(input_schema, SENSITIVE),
        output_marks_sensitive=marks_anything(output_schema, SENSITIVE),
        output_marks_hidden=marks_anything(output_schema, MODEL_VISIBLE),
    )


def _declared(code: str, spec: ErrorSpec) -> DeclaredError:
    if isinstance(spec, DeclaredError):
        return spec
    if isinstance(spec, str):
        return DeclaredError(code=code, message=spec)
    return DeclaredError(
        code=code, message=str(spec["message"]), retryable=bool(spec.get("retryable", False))
    )


@dataclass(frozen=True, slots=True)
class DiscoveredCapability:
    """A capability as discovery shows it to an actor on a surface.

    Attributes:
        id: e.g. ``orders.refund``.
        version: The latest registered version.
        service: The owning service.
        description: Written for the models that choose among capabilities.
        input_schema: The registered JSON Schema of the arguments.
        output_schema: The registered JSON Schema of the output (fields marked
            ``x-warden-model-visible: false`` are still in it).
        side_effect: ``read``, ``write`` or ``idempotent``.
        tags: The capability's tags.
    """

    id: str
    version: str
    service: str
    description: str
    input_schema: dict[str, Any] = field(repr=False)
    output_schema: dict[str, Any] = field(repr=False)
    side_effect: SideEffect
    tags: tuple[str, ...]


def discovered_from_proto(capability: registry_pb2.Capability) -> DiscoveredCapability:
    d = capability.definition
    return DiscoveredCapability(
        id=d.id,
        version=d.version,
        service=capability.service,
        description=d.description,
        input_schema=json.loads(d.input_schema_json) if d.input_schema_json else {},
        output_schema=json.loads(d.output_schema_json) if d.output_schema_json else {},
        side_effect=_SIDE_EFFECT_NAMES.get(d.side_effect, "write"),
        tags=tuple(d.tags),
    )
