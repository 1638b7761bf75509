"""The Registry servicer: register, list and get capabilities."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from warden.v1 import registry_pb2, registry_pb2_grpc
from warden_server import discovery
from warden_server.errors import FailedPrecondition, InvalidRequest, NotFound
from warden_server.plane import Plane
from warden_server.policy.inputs import InputSchema
from warden_server.policy.typecheck import rules_broken_by
from warden_server.registry import CapabilityDefinition, is_capability_id
from warden_server.services import convert
from warden_server.services.governor import calling_service
from warden_server.services.status import rpc


class RegistryServicer(registry_pb2_grpc.RegistryServicer):
    def __init__(self, plane: Plane) -> None:
        self._plane = plane

    @rpc
    def Register(
        self, request: registry_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> registry_pb2.RegisterResponse:
        service = calling_service(self._plane, context)
        limits = self._plane.config.limits
        if len(request.capabilities) > limits.max_capabilities_per_register:
            raise InvalidRequest(
                f"{len(request.capabilities)} capabilities in one Register call; at most "
                f"{limits.max_capabilities_per_register} ([limits] "
                "max_capabilities_per_register): register them in several calls"
            )
        definitions = [
            convert.definition_from_proto(d, limits.max_schema_bytes) for d in request.capabilities
        ]
        registered = self._plane.registry.register(
            service, definitions, refuse=self._refuse_if_rules_break
        )
        return registry_pb2.RegisterResponse(
            capabilities=[convert.capability_to_proto(c) for c in registered]
        )

    def _refuse_if_rules_break(self, definitions: Sequence[CapabilityDefinition]) -> None:
        schemas = [InputSchema(d.id, d.input_schema, d.version) for d in definitions]
        broken = rules_broken_by(self._plane.policies.current(), schemas)
        if broken:
            raise FailedPrecondition(
                "this registration would break policy rules in force; fix the rules or the "
                "input schema:\n  " + "\n  ".join(broken)
            )

    @rpc
    def ListCapabilities(
        self, request: registry_pb2.ListCapabilitiesRequest, context: grpc.ServicerContext
    ) -> registry_pb2.ListCapabilitiesResponse:
        viewer = self._viewer(context, request.actor_token, request.surface, request.context_json)
        found = discovery.list_visible(self._plane, viewer)
        return registry_pb2.ListCapabilitiesResponse(
            capabilities=[convert.capability_to_proto(c) for c in found]
        )

    @rpc
    def GetCapability(
        self, request: registry_pb2.GetCapabilityRequest, context: grpc.ServicerContext
    ) -> registry_pb2.GetCapabilityResponse:
        viewer = self._viewer(context, request.actor_token, request.surface, request.context_json)
        found = None
        if is_capability_id(request.id):  # else it names nothing: not found, as in Begin
            found = discovery.get_visible(self._plane, viewer, request.id, request.version)
        if found is None:
            raise NotFound("Capability not found.")
        return registry_pb2.GetCapabilityResponse(capability=convert.capability_to_proto(found))

    def _viewer(
        self, context: grpc.ServicerContext, actor_token: str, surface: str, context_json: str
    ) -> discovery.Viewer:
        service = calling_service(self._plane, context)
        return discovery.Viewer(
            service=service,
            actor=self._plane.actors.verify(actor_token),
            surface=convert.surface_of(surface),
            context=convert.context_of(context_json, self._plane.config.limits.max_context_bytes),
        )
