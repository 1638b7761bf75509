"""The Audit servicer: query, stats, verify and export for auditors (SI-13)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc

from warden.v1 import audit_pb2, audit_pb2_grpc
from warden_server.audit import reader
from warden_server.audit.access import authorize_read
from warden_server.auth.actors import Actor
from warden_server.limits import epoch, usage_report
from warden_server.plane import Plane
from warden_server.services import convert
from warden_server.services.metadata import actor_token
from warden_server.services.status import rpc, stream_rpc

DEFAULT_LIMIT = 100


class AuditServicer(audit_pb2_grpc.AuditServicer):
    def __init__(self, plane: Plane) -> None:
        self._plane = plane

    def _auditor(self, context: grpc.ServicerContext) -> Callable[[], Actor]:
        # Authenticated inside authorize_read, so a refusal is recorded too.
        return lambda: self._plane.actors.verify(actor_token(context))

    @rpc
    def Query(
        self, request: audit_pb2.QueryRequest, context: grpc.ServicerContext
    ) -> audit_pb2.QueryResponse:
        plane = self._plane
        f = convert.audit_filter_from_proto(request.filter)
        limit = request.limit or DEFAULT_LIMIT
        before = convert.page_token_of(request.page_token)
        scope = authorize_read(
            plane, self._auditor(context), "query", f, limit=limit, before=before
        )
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
        scope = authorize_read(plane, self._auditor(context), "stats", f, by=request.by)
        stats = reader.stats(plane.store, request.by, f, now=plane.clock(), scope=scope)
        return convert.stats_to_proto(stats)

    @rpc
    def Verify(
        self, request: audit_pb2.VerifyRequest, context: grpc.ServicerContext
    ) -> audit_pb2.VerifyResponse:
        plane = self._plane
        authorize_read(plane, self._auditor(context), "verify", every_tenant=True)
        return convert.verify_to_proto(reader.verify(plane.store, plane.checkpoints))

    @stream_rpc
    def Export(
        self, request: audit_pb2.ExportRequest, context: grpc.ServicerContext
    ) -> Iterator[audit_pb2.AuditRecord]:
        plane = self._plane
        f = convert.audit_filter_from_proto(request.filter)
        scope = authorize_read(plane, self._auditor(context), "export", f)
        for row in reader.export(plane.store, f, now=plane.clock(), scope=scope):
            yield convert.audit_record_to_proto(row)

    @rpc
    def LimitUsage(
        self, request: audit_pb2.LimitUsageRequest, context: grpc.ServicerContext
    ) -> audit_pb2.LimitUsageResponse:
        plane = self._plane
        key = request.key if request.HasField("key") else None
        authorize_read(
            plane,
            self._auditor(context),
            "limits",
            every_tenant=True,
            limit_id=request.limit_id or None,
            key=key,
        )
        policies = plane.policies.current()
        now = epoch(plane.clock())
        report = usage_report(policies, plane.store, now, request.limit_id, key)
        return convert.limit_usage_to_proto(policies.revision, report)
