"""Complete: pipeline step 14 — record the outcome of a granted invocation.

When the invocation holds an idempotency reservation, its outcome is recorded
there for replay (the output sealed, never in clear), or the key is released
when the failure changed nothing (see ``idempotency.records_for_replay``).

A report is safe to repeat. The SDK repeats one whose answer it never heard
(the plane went away meanwhile), so the same report again is answered with the
record the first one made, and nothing is written twice; a different report
for an invocation already completed is a conflict. Which report completed an
invocation is decided in the store's write transaction, not by a read before
it, so this holds between the processes of a plane too.

Many reports (``CompleteMany``) are each checked and read as one alone, and
the writes of those that pass are committed together (``complete_all``): one
commit for all of them, each still answered as ``complete`` answers it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context as otel_context
from opentelemetry import propagate

from warden.shared.canonical import canonical_json, compact_json, digest, strict_loads
from warden.shared.codes import STAGES, defaults
from warden_server.auth.services import Service
from warden_server.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from warden_server.grants import GrantError
from warden_server.limits import give_back
from warden_server.pipeline.idempotency import records_for_replay, replay_binding
from warden_server.records.events import AuditEvent, now_iso
from warden_server.store import IdempotencyRecord, InvocationRecord, WriteTransaction

if TYPE_CHECKING:
    from warden_server.plane import Plane

OUTCOME_STATUSES: Final = ("succeeded", "failed", "cancelled")
MAX_DIAGNOSTIC_CHARS: Final = 64_000


@dataclass(frozen=True, slots=True)
class OutcomeFailure:
    code: str
    stage: str
    public_message: str
    retryable: bool
    exposed: bool
    details: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class CompleteRequest:
    service: Service
    invocation_id: str
    grant_token: str
    status: str
    failure: OutcomeFailure | None
    output_json: str
    executed_before_failure: bool
    cause_type: str
    cause_message: str
    stack: str
    duration_ms: int
    deadline: float = math.inf
    """When the plane stops working on this request (``time.monotonic()``)."""
    trace_context: Mapping[str, str] | None = None
    """The trace of the invocation the report ends, as metadata carries it (W3C
    ``traceparent``): its outcome record carries that trace id. None: the
    record carries the current trace's (that of the call the report came in)."""


class _AlreadyCompleted(Exception):
    """Another report completed the invocation first (its work is rolled back)."""


@dataclass(frozen=True, slots=True)
class _Report:
    """A report checked and read, its write ready for the store."""

    invocation_id: str
    digest: str
    work: Callable[[WriteTransaction], int]


def complete(plane: Plane, request: CompleteRequest) -> int:
    """Append the outcome record; returns its sequence number (that of the
    record already made, for a report made before).

    Raises:
        InvalidRequest: malformed fields.
        PermissionDenied: a forged grant, or another service's invocation (SI-7).
        NotFound: no such granted invocation.
        Conflict: another outcome was already reported.
    """
    (answer,) = complete_all(plane, [request])
    if isinstance(answer, Exception):
        raise answer
    return answer


def complete_all(plane: Plane, requests: Sequence[CompleteRequest]) -> list[int | Exception]:
    """Append the outcome records of many reports, committed together: one
    answer per report, in order, each what ``complete`` answers for it alone
    (the sequence number, or the exception it raises).

    Each report is checked and read on its own; the writes of those that pass
    go to the store at once (``Store.transact_each``), by the earliest deadline
    among the reports.
    """
    prepared = [_prepared(plane, request) for request in requests]
    reports = [p for p in prepared if isinstance(p, _Report)]
    deadline = min((r.deadline for r in requests), default=math.inf)
    written = iter(plane.store.transact_each([r.work for r in reports], deadline=deadline))
    return [_answer(plane, p, next(written)) if isinstance(p, _Report) else p for p in prepared]


def _prepared(plane: Plane, request: CompleteRequest) -> int | Exception | _Report:
    """The report checked and ready to write; or its answer without a write (a
    repeated report), or the exception that refuses it."""
    try:
        with _trace_of(plane, request):
            return _prepare(plane, request)
    except Exception as exc:
        return exc


def _answer(plane: Plane, report: _Report, written: int | BaseException) -> int | Exception:
    """A report's answer from what its write did."""
    if isinstance(written, _AlreadyCompleted):
        try:
            completed = plane.store.get_invocation(report.invocation_id)
            assert completed is not None
            return _repeated(completed, report.digest)
        except Exception as exc:
            return exc
    if isinstance(written, Exception):
        return written
    if isinstance(written, BaseException):
        raise written
    return written


@contextmanager
def _trace_of(plane: Plane, request: CompleteRequest) -> Iterator[None]:
    """The report's own trace made current while it is checked and its outcome
    record built (which takes its trace id from there). While spans are
    exported, a ``warden.complete`` span in that trace shows the report being
    taken, whichever call brought it."""
    if request.trace_context is None:
        yield
        return
    carried = propagate.extract(dict(request.trace_context))
    if plane.telemetry.tracing:
        with plane.telemetry.tracer.start_as_current_span(
            "warden.complete",
            context=carried,
            attributes={"warden.invocation_id": request.invocation_id},
        ):
            yield
        return
    token = otel_context.attach(carried)
    try:
        yield
    finally:
        otel_context.detach(token)


def _prepare(plane: Plane, request: CompleteRequest) -> int | _Report:
    """Check a report and read what its write needs (raising what ``complete``
    raises); the answer at once for a report already recorded."""
    _check_shape(request)
    try:
        claims = plane.grants.verify(request.grant_token, verify_expiry=False)
    except GrantError as exc:
        raise PermissionDenied(f"grant not accepted: {exc}") from None
    if claims.invocation_id != request.invocation_id:
        raise PermissionDenied("the grant was issued for another invocation")
    if claims.service != request.service.name or not request.service.owns(claims.capability_id):
        raise PermissionDenied(
            f"service {request.service.name!r} may not report {claims.capability_id}"
        )
    invocation = plane.store.get_invocation(request.invocation_id)
    if invocation is None:
        raise NotFound(f"no granted invocation {request.invocation_id}")
    return _recorded(plane, request, invocation)


def _recorded(
    plane: Plane, request: CompleteRequest, invocation: InvocationRecord
) -> int | _Report:
    """The write that records a checked report's outcome of ``invocation``;
    the answer at once for a report already recorded."""
    report = report_digest(request)
    if invocation.state == "completed":
        return _repeated(invocation, report)
    capability = plane.registry.get(invocation.capability_id, invocation.capability_version)
    output = value = None
    if request.output_json:
        try:
            value = strict_loads(request.output_json)
            canonical_json(value)
        except ValueError as exc:
            raise InvalidRequest(f"output_json is not valid JSON: {exc}") from None
        if capability is not None and not capability.sensitive_output:
            output = compact_json(value)  # nothing marked: nothing to redact
        else:
            schema = capability.definition.output_schema if capability else {}
            output = compact_json(plane.redaction.value(value, schema))
    failure = request.failure
    event = AuditEvent(
        kind="outcome",
        status=request.status,
        invocation_id=invocation.invocation_id,
        capability_id=invocation.capability_id,
        capability_version=invocation.capability_version,
        service=invocation.service,
        actor_id=invocation.actor_id,
        tenant=invocation.tenant,
        surface=invocation.surface,
        stage=failure.stage if failure else None,
        code=failure.code if failure else None,
        exposed=failure.exposed if failure else None,
        retryable=failure.retryable if failure else None,
        public_message=failure.public_message if failure else None,
        executed_before_failure=request.executed_before_failure,
        input_digest=invocation.input_digest,
        output=output,
        cause_type=request.cause_type[:256] or None,
        cause_message=request.cause_message[:MAX_DIAGNOSTIC_CHARS] or None,
        stack=request.stack[:MAX_DIAGNOSTIC_CHARS] or None,
        duration_ms=request.duration_ms,
        details=compact_json(failure.details) if failure and failure.details else None,
        call_id=invocation.call_id,
        attempt=invocation.attempt,
    )
    reservation = plane.store.idempotency_of(invocation.invocation_id)
    sealed = (
        plane.sealer.seal(compact_json(value), replay_binding(reservation))
        if reservation is not None and request.status == "succeeded"
        else None
    )

    def work(tx: WriteTransaction) -> int:
        completed_at = now_iso()
        seq = tx.append_audit(event)
        if not tx.complete_invocation(
            invocation.invocation_id, completed_at, outcome_seq=seq, report_digest=report
        ):
            raise _AlreadyCompleted
        give_back(
            tx,
            invocation.invocation_id,
            handler_ran=request.executed_before_failure,
            succeeded=request.status == "succeeded",
        )
        if reservation is not None:
            _settle(tx, reservation, request, completed_at, sealed)
        return seq

    return _Report(invocation.invocation_id, report, work)


UNDELIVERED: Final = "the answer never reached the caller: the call ended before its grant was sent"
"""The cause on the outcome the plane records for a grant it never delivered."""


def undelivered(
    plane: Plane, invocation: InvocationRecord, service: Service
) -> Callable[[WriteTransaction], int] | None:
    """The write that closes a grant whose ``Begin`` ended before answering
    (the caller cancelled it, its deadline passed, or the plane stopped)
    while its decision was committed: no grant token was ever made, so the
    handler cannot have run under it. The outcome is recorded as the caller
    would report a cancellation before the handler ran (``CANCELLED``,
    retryable, not executed), which releases an idempotency key for the
    retry and gives back what a limit counted, instead of leaving the grant
    ambiguous until it expires. None when the invocation already has its
    outcome."""
    cancelled = defaults("CANCELLED")
    request = CompleteRequest(
        service=service,
        invocation_id=invocation.invocation_id,
        grant_token="",
        status="cancelled",
        failure=OutcomeFailure(
            code=cancelled.code,
            stage=cancelled.stage,
            public_message=cancelled.public_message,
            retryable=cancelled.retryable,
            exposed=cancelled.exposed,
            details=None,
        ),
        output_json="",
        executed_before_failure=False,
        cause_type="",
        cause_message=UNDELIVERED,
        stack="",
        duration_ms=0,
    )
    recorded = _recorded(plane, request, invocation) if invocation.state == "granted" else None
    return recorded.work if isinstance(recorded, _Report) else None


def report_digest(request: CompleteRequest) -> str:
    """What makes two reports the same report: everything they say of the outcome."""
    failure = request.failure
    return digest(
        {
            "status": request.status,
            "failure": asdict(failure) if failure else None,
            "output_json": request.output_json,
            "executed_before_failure": request.executed_before_failure,
            "cause_type": request.cause_type,
            "cause_message": request.cause_message,
            "stack": request.stack,
            "duration_ms": request.duration_ms,
        }
    )


def _repeated(invocation: InvocationRecord, report: str) -> int:
    """The answer to a report for a completed invocation: the record the same
    report made, or a conflict for another one."""
    if invocation.outcome_seq is not None and invocation.outcome_digest == report:
        return invocation.outcome_seq
    raise Conflict(f"another outcome of {invocation.invocation_id} was already reported")


def _settle(
    tx: WriteTransaction,
    reservation: IdempotencyRecord,
    request: CompleteRequest,
    completed_at: str,
    sealed: bytes | None,
) -> None:
    failure = request.failure
    retryable = failure.retryable if failure else False
    if not records_for_replay(request.status, retryable, request.executed_before_failure):
        tx.release_idempotency(reservation.invocation_id)
        return
    tx.settle_idempotency(
        reservation.invocation_id,
        completed_at,
        status=request.status,
        failure=compact_json(asdict(failure)) if failure else None,
        executed_before_failure=request.executed_before_failure,
        sealed_output=sealed,
    )


def _check_shape(request: CompleteRequest) -> None:
    if not request.invocation_id:
        raise InvalidRequest("invocation_id is required")
    if not request.grant_token:
        raise InvalidRequest("grant_token is required")
    if request.status not in OUTCOME_STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(OUTCOME_STATUSES)}")
    if request.status == "succeeded":
        if request.failure is not None:
            raise InvalidRequest("a succeeded outcome carries no failure")
        return
    failure = request.failure
    if failure is None or not failure.code:
        raise InvalidRequest(f"a {request.status} outcome needs a failure with a code")
    if failure.stage not in STAGES:
        raise InvalidRequest(f"unknown stage {failure.stage!r}")
