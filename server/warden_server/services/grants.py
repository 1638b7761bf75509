"""The GrantKeys servicer: the public keys that sign grants."""

from __future__ import annotations

import grpc

from warden.v1 import grants_pb2, grants_pb2_grpc
from warden_server.plane import Plane
from warden_server.services import convert
from warden_server.services.status import rpc


class GrantKeysServicer(grants_pb2_grpc.GrantKeysServicer):
    def __init__(self, plane: Plane) -> None:
        self._plane = plane

    @rpc
    def ListGrantKeys(
        self, request: grants_pb2.ListGrantKeysRequest, context: grpc.ServicerContext
    ) -> grants_pb2.ListGrantKeysResponse:
        # Public keys are public: no credential is asked for.
        keys = self._plane.grants.published()
        return grants_pb2.ListGrantKeysResponse(keys=[convert.grant_key_to_proto(k) for k in keys])
