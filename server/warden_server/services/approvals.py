"""The Approvals servicer: approvers list, inspect, decide and watch approvals.

Approvers call with their own JWT in the ``authorization`` metadata; no
service token is involved.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from warden.v1 import approvals_pb2, approvals_pb2_grpc
from warden_server.approvals import deciding
from warden_server.auth.actors import Actor
from warden_server.plane import Plane
from warden_server.services import convert
from warden_server.services.metadata import actor_token
from warden_server.services.status import rpc, stream_rpc


class ApprovalsServicer(approvals_pb2_grpc.ApprovalsServicer):
    def __init__(self, plane: Plane) -> None:
        self._plane = plane

    def _approver(self, context: grpc.ServicerContext) -> Actor:
        return self._plane.actors.verify(actor_token(context))

    @rpc
    def ListApprovals(
        self, request: approvals_pb2.ListApprovalsRequest, context: grpc.ServicerContext
    ) -> approvals_pb2.ListApprovalsResponse:
        views = deciding.list_approvals(
            self._plane,
            self._approver(context),
            convert.approval_states_of(request.states),
            request.limit or 100,
        )
        return approvals_pb2.ListApprovalsResponse(
            approvals=[convert.approval_to_proto(v) for v in views]
        )

    @rpc
    def GetApproval(
        self, request: approvals_pb2.GetApprovalRequest, context: grpc.ServicerContext
    ) -> approvals_pb2.GetApprovalResponse:
        found = deciding.get_approval(self._plane, self._approver(context), request.id)
        return approvals_pb2.GetApprovalResponse(approval=convert.approval_to_proto(found))

    @rpc
    def Approve(
        self, request: approvals_pb2.ApproveRequest, context: grpc.ServicerContext
    ) -> approvals_pb2.ApproveResponse:
        decided = deciding.decide(
            self._plane, lambda: self._approver(context), request.id, "approved", request.reason
        )
        return approvals_pb2.ApproveResponse(approval=convert.approval_to_proto(decided))

    @rpc
    def Deny(
        self, request: approvals_pb2.DenyRequest, context: grpc.ServicerContext
    ) -> approvals_pb2.DenyResponse:
        decided = deciding.decide(
            self._plane, lambda: self._approver(context), request.id, "denied", request.reason
        )
        return approvals_pb2.DenyResponse(approval=convert.approval_to_proto(decided))

    @stream_rpc
    def Watch(
        self, request: approvals_pb2.WatchApprovalsRequest, context: grpc.ServicerContext
    ) -> Iterator[approvals_pb2.ApprovalEvent]:
        plane = self._plane
        approver = self._approver(context)
        # Subscribe before listing, so nothing falls between the two.
        with plane.approval_events.subscribe(approver.tenant) as subscription:
            context.add_callback(subscription.close)
            if request.include_pending:
                pending = deciding.list_approvals(plane, approver, ["pending"], deciding.MAX_LIST)
                for view in reversed(pending):
                    yield convert.approval_event_to_proto("pending", view)
            for change in subscription:
                view = deciding.view(plane, approver, change.approval)
                yield convert.approval_event_to_proto(change.kind, view)
