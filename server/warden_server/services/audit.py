"""The Audit servicer: query, stats, verify and export for auditors (SI-13)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from warden.shared.wire import ACTOR_TOKEN_METADATA
from warden.v1 import audit_pb2, audit_pb2_grpc
from warden_server.audit import reader
from warden_server.audit.access import authorize_read
from warden_server.plane import Plane
from warden_server.services import convert
from warden_server.services.status import rpc, rpc_stream

DEFAULT_LIMIT = 100


def bearer_token(context: grpc.ServicerContext) -> str:
    """The actor JWT of ``authorization: Bearer <jwt>``, or "" when absent."""
    value = dict(context.invocation_metadata()).get(ACTOR_TOKEN_METADATA, "")
    if not isinstance(value, str):
        return ""
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class AuditServicer(audit_pb2_grpc.AuditServicer):
    def __init__(self, plane: Plane) -> None:
        self._plane = plane

    @rpc
    def Query(
        self, request: audit_pb2.QueryRequest, context: grpc.ServicerContext
    ) -> audit_pb2.QueryResponse:
        plane = self._plane
        f = convert.audit_filter_from_proto(request.filter)
        limit = request.limit or DEFAULT_LIMIT
        before = convert.page_token_of(request.page_token)
        scope = authorize_read(plane, bearer_token(context), "query", f, limit=limit, before=before)
        page = reader.query(
            plane.store, f, now=plane.clock(), scope=scope, limit=limit, before=before
        )
        return convert.page_to_proto(page)

    @rpc
    def Stats(
        self, request: audit_pb2.StatsRequest, context: grpc.ServicerContext
    ) -> audit_pb2.StatsResponse:
        plane = self._plane
        f = convert.audit_filter_from_proto(request.filter)
        scope = authorize_read(plane, bearer_token(context), "stats", f, by=request.by)
        stats = reader.stats(plane.store, request.by, f, now=plane.clock(), scope=scope)
        return convert.stats_to_proto(stats)

    @rpc
    def Verify(
        self, request: audit_pb2.VerifyRequest, context: grpc.ServicerContext
    ) -> audit_pb2.VerifyResponse:
        plane = self._plane
        authorize_read(plane, bearer_token(context), "verify", every_tenant=True)
        return convert.verify_to_proto(reader.verify(plane.store, plane.checkpoints))

    @rpc_stream
    def Export(
        self, request: audit_pb2.ExportRequest, context: grpc.ServicerContext
    ) -> Iterator[audit_pb2.AuditRecord]:
        plane = self._plane
        f = convert.audit_filter_from_proto(request.filter)
        scope = authorize_read(plane, bearer_token(context), "export", f)
        for row in reader.export(plane.store, f, now=plane.clock(), scope=scope):
            yield convert.audit_record_to_proto(row)
