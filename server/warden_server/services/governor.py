"""The Governor servicer: Begin, Complete and CompleteMany."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

import grpc

from warden.shared.wire import MAX_IDEMPOTENCY_KEY, PROCESS_METADATA
from warden.v1 import governor_pb2, governor_pb2_grpc
from warden_server.auth.services import SERVICE_TOKEN_METADATA, Service, ServiceAuthenticationError
from warden_server.config import Config
from warden_server.errors import InvalidRequest
from warden_server.pipeline.begin import (
    BeginResult,
    InvocationIdReused,
    abegin,
    reject,
    rejection,
)
from warden_server.pipeline.complete import (
    CompleteRequest,
    OutcomeFailure,
    complete,
    complete_all,
    undelivered,
)
from warden_server.pipeline.context import BeginRequest
from warden_server.plane import Plane
from warden_server.registry import recorded_capability_id
from warden_server.services import convert
from warden_server.services.status import async_rpc, refusal_of, rpc

log = logging.getLogger(__name__)

MAX_REPORTS: Final = 256
"""The most outcome reports one CompleteMany call carries."""


Context = grpc.ServicerContext | grpc.aio.ServicerContext[Any, Any]
"""A blocking method's context, or a coroutine's on the server's loop."""


def calling_service(plane: Plane, context: Context) -> Service:
    metadata = dict(context.invocation_metadata() or ())
    token = metadata.get(SERVICE_TOKEN_METADATA)
    return plane.services.authenticate(token if isinstance(token, str) else None)


def _name_process(plane: Plane, context: Context) -> None:
    """Say which process answers (``x-warden-process``): a service's
    connections reach a plane's processes unevenly, and the SDK balances its
    calls by process once it knows which connections share one."""
    context.set_trailing_metadata(((PROCESS_METADATA, plane.process_id),))


class GovernorServicer(governor_pb2_grpc.GovernorServicer):
    def __init__(self, plane: Plane) -> None:
        self._plane = plane

    @async_rpc
    async def Begin(
        self, request: governor_pb2.BeginRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> governor_pb2.BeginResponse:
        # Runs on the server's event loop, whose thread also commits the
        # records (``SQLiteStore.commit_on``): nothing here may block on a
        # commit, so every record is awaited.
        plane = self._plane
        _name_process(plane, context)
        service_name = None
        try:
            service = calling_service(plane, context)
            service_name = service.name
            decoded = _decode_begin(request, service, plane.config, _deadline(plane, context))
        except ServiceAuthenticationError as exc:
            # On the record (SI-3), but a caller without a valid service token
            # costs no fsync each: the first of a window is recorded, the rest
            # counted into one summary, and no invocation id is spent for it.
            why = f"{type(exc).__name__}: {exc}"
            await asyncio.get_running_loop().run_in_executor(
                None,
                functools.partial(
                    plane.audit_reads.refused,
                    ("begin-rejected", why),
                    lambda: rejection(
                        plane,
                        reason=why,
                        capability_id=recorded_capability_id(request.capability_id),
                        surface=request.surface[:32],
                    ),
                    action="begin",
                ),
            )
            raise
        except Exception as exc:
            # Refused before any stage ran, and on the record all the same (SI-3),
            # whatever refused it.
            designed = isinstance(exc, InvalidRequest)
            refused = reject(
                plane,
                reason=f"{type(exc).__name__}: {exc}"
                if designed
                else f"internal-error: {type(exc).__name__}",
                invocation_id=request.invocation_id[:64],
                capability_id=recorded_capability_id(request.capability_id),
                service=service_name,
                surface=request.surface[:32],
            )
            await plane.store.atransact(refused.work)
            raise
        try:
            result = await abegin(plane, decoded)
        except asyncio.CancelledError:
            # The call ended (cancelled, its deadline passed, or the server
            # stopping) while the decision was being committed: a grant its
            # caller never received is closed on the record.
            closing = asyncio.get_running_loop().create_task(
                _close_undelivered(plane, decoded.invocation_id, service)
            )
            plane.closing.add(closing)
            closing.add_done_callback(plane.closing.discard)
            raise
        except Exception as exc:
            # An id already decided (its twin's decision stands) or whatever
            # broke: the attempt is on the record (SI-3) before the caller hears
            # why, or a generic INTERNAL status.
            designed = isinstance(exc, InvocationIdReused)
            refused = reject(
                plane,
                reason=f"{type(exc).__name__}: {exc}"
                if designed
                else f"internal-error: {type(exc).__name__}",
                invocation_id=decoded.invocation_id,
                capability_id=decoded.capability_id,
                service=service_name,
                surface=decoded.surface,
            )
            await plane.store.atransact(refused.work)
            raise
        return _encode_begin(result)

    @rpc
    def Complete(
        self, request: governor_pb2.CompleteRequest, context: grpc.ServicerContext
    ) -> governor_pb2.CompleteResponse:
        _name_process(self._plane, context)
        service = calling_service(self._plane, context)
        decoded = _decode_complete(
            request, service, self._plane.config, _deadline(self._plane, context)
        )
        return governor_pb2.CompleteResponse(audit_seq=complete(self._plane, decoded))

    @rpc
    def CompleteMany(
        self, request: governor_pb2.CompleteManyRequest, context: grpc.ServicerContext
    ) -> governor_pb2.CompleteManyResponse:
        _name_process(self._plane, context)
        service = calling_service(self._plane, context)
        if len(request.reports) > MAX_REPORTS:
            raise InvalidRequest(
                f"a call carries at most {MAX_REPORTS} reports, not {len(request.reports)}"
            )
        deadline = _deadline(self._plane, context)
        decoded: list[CompleteRequest | Exception] = []
        for report in request.reports:
            try:
                decoded.append(
                    _decode_complete(
                        report.request,
                        service,
                        self._plane.config,
                        deadline,
                        trace_context=dict(report.trace_context),
                    )
                )
            except Exception as exc:
                decoded.append(exc)
        taken = iter(
            complete_all(self._plane, [d for d in decoded if isinstance(d, CompleteRequest)])
        )
        return governor_pb2.CompleteManyResponse(
            results=[
                _complete_result(next(taken) if isinstance(d, CompleteRequest) else d)
                for d in decoded
            ]
        )


async def _close_undelivered(plane: Plane, invocation_id: str, service: Service) -> None:
    """Record the outcome of ``invocation_id`` if its ``Begin`` granted it
    but never answered (``complete.undelivered``)."""
    try:
        # The Begin's own write is queued; a write queued after it commits
        # after it, so the invocation then reads as the Begin left it.
        await plane.store.atransact(_nothing)
        invocation = plane.store.get_invocation(invocation_id)
        work = undelivered(plane, invocation, service) if invocation is not None else None
        if work is not None:
            await plane.store.atransact(work)
            log.info("invocation %s: granted, but its caller was gone; closed", invocation_id)
    except Exception as exc:  # the store closing with the plane, say: it stays open
        log.warning(
            "invocation %s: granted, but its caller was gone, and closing it failed "
            "(%s: %s); it ends when its grant expires",
            invocation_id,
            type(exc).__name__,
            exc,
        )


def _nothing(tx: object) -> None:
    return None


def _deadline(plane: Plane, context: Context) -> float:
    """When to stop working on a request: the plane's own budget, or the
    caller's deadline when that comes first."""
    budget = plane.config.server.request_deadline_ms / 1000
    remaining = context.time_remaining()
    if remaining is not None:
        budget = min(budget, remaining)
    return time.monotonic() + budget


def _decode_complete(
    request: governor_pb2.CompleteRequest,
    service: Service,
    config: Config,
    deadline: float,
    *,
    trace_context: Mapping[str, str] | None = None,
) -> CompleteRequest:
    status = convert.OUTCOME_STATUSES.get(request.status)
    if status is None:
        raise InvalidRequest("status must be SUCCEEDED, FAILED or CANCELLED")
    failure = None
    if request.HasField("failure"):
        f = request.failure
        failure = OutcomeFailure(
            code=f.code,
            stage=f.stage,
            public_message=f.public_message,
            retryable=f.retryable,
            exposed=f.exposed,
            details=convert.details_of(f.details_json, config.limits.max_context_bytes),
        )
    return CompleteRequest(
        service=service,
        invocation_id=request.invocation_id,
        grant_token=request.grant_token,
        status=status,
        failure=failure,
        output_json=request.output_json,
        executed_before_failure=request.executed_before_failure,
        cause_type=request.diagnostics.cause_type,
        cause_message=request.diagnostics.cause_message,
        stack=request.diagnostics.stack,
        duration_ms=request.duration_ms,
        deadline=deadline,
        trace_context=trace_context,
    )


def _complete_result(answer: int | Exception) -> governor_pb2.CompleteResult:
    """One report's answer: its record's sequence number, or what Complete
    would have refused it with."""
    if isinstance(answer, Exception):
        code, message = refusal_of(answer, "CompleteMany")
        return governor_pb2.CompleteResult(
            refusal=governor_pb2.ReportRefusal(code=code.name, message=message)
        )
    return governor_pb2.CompleteResult(audit_seq=answer)


def _decode_begin(
    request: governor_pb2.BeginRequest, service: Service, config: Config, deadline: float
) -> BeginRequest:
    # A capability id that cannot name a capability (empty, too long) is not a
    # malformed request but an unknown capability: resolve answers it (SI-8).
    if len(request.idempotency_key) > MAX_IDEMPOTENCY_KEY:
        raise InvalidRequest(f"idempotency_key is longer than {MAX_IDEMPOTENCY_KEY} characters")
    return BeginRequest(
        service=service,
        invocation_id=convert.invocation_id_of(request.invocation_id),
        capability_id=recorded_capability_id(request.capability_id),
        capability_version=request.capability_version,
        actor_token=request.actor_token,
        input_json=request.input_json,
        surface=convert.surface_of(request.surface),
        context=convert.context_of(request.context_json, config.limits.max_context_bytes),
        approval_id=request.approval_id,
        idempotency_key=request.idempotency_key,
        call_id=convert.invocation_id_of(request.call_id, "call_id") if request.call_id else None,
        attempt=request.attempt or None,
        timeout_ms=request.timeout_ms,
        deadline=deadline,
    )


def _encode_begin(result: BeginResult) -> governor_pb2.BeginResponse:
    """The answer, built once: each outcome is given to the response's
    constructor rather than built apart and copied in."""
    invocation, revision = result.invocation_id, result.policy_revision
    if result.grant is not None:
        grant, actor = result.grant, result.context.actor
        assert actor is not None
        return governor_pb2.BeginResponse(
            invocation_id=invocation,
            policy_revision=revision,
            grant=governor_pb2.Grant(
                token=grant.token,
                capability_version=grant.capability_version,
                input_json=grant.input_json,
                input_digest=grant.input_digest,
                actor=convert.actor_to_proto(actor),
                timeout_ms=grant.timeout_ms,
                expires_at=convert.timestamp(grant.expires_at),
            ),
        )
    if result.approval_id is not None:
        assert result.failure is not None and result.approval_expires_at is not None
        return governor_pb2.BeginResponse(
            invocation_id=invocation,
            policy_revision=revision,
            suspension=governor_pb2.Suspension(
                failure=convert.failure_to_proto(result.failure),
                approval_id=result.approval_id,
                expires_at=convert.timestamp(result.approval_expires_at),
            ),
        )
    if result.replay is not None:
        return governor_pb2.BeginResponse(
            invocation_id=invocation,
            policy_revision=revision,
            replay=convert.replay_to_proto(result.replay),
        )
    assert result.failure is not None
    return governor_pb2.BeginResponse(
        invocation_id=invocation,
        policy_revision=revision,
        failure=convert.failure_to_proto(result.failure),
    )
