"""The Policies servicer: the policy set in force and what it is checked against."""

from __future__ import annotations

import grpc

from warden.v1 import policy_pb2, policy_pb2_grpc
from warden_server.auth.roles import POLICY_READERS, require_any_role
from warden_server.plane import Plane
from warden_server.replicas import live_replicas
from warden_server.services import convert
from warden_server.services.status import rpc


class PoliciesServicer(policy_pb2_grpc.PoliciesServicer):
    def __init__(self, plane: Plane) -> None:
        self._plane = plane

    def _authorize(self, token: str, action: str) -> None:
        require_any_role(self._plane.actors.verify(token), POLICY_READERS, action)

    @rpc
    def GetStatus(
        self, request: policy_pb2.PolicyStatusRequest, context: grpc.ServicerContext
    ) -> policy_pb2.PolicyStatus:
        self._authorize(request.actor_token, "reading the policy status")
        plane = self._plane
        reloader = plane.reloader
        interval = plane.config.server.replica_report_seconds
        return convert.policy_status_to_proto(
            plane.policies.status(),
            str(reloader.directory),
            reloader.watching,
            live_replicas(plane.store, interval, plane.clock()),
            plane.replica_id,
            include_rules=request.include_rules,
        )

    @rpc
    def ListCapabilities(
        self, request: policy_pb2.PolicyCapabilitiesRequest, context: grpc.ServicerContext
    ) -> policy_pb2.PolicyCapabilitiesResponse:
        self._authorize(request.actor_token, "listing capabilities for policy checks")
        return policy_pb2.PolicyCapabilitiesResponse(
            capabilities=[
                convert.capability_to_proto(c) for c in self._plane.registry.every_version()
            ]
        )
