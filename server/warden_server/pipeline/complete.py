"""Complete: pipeline step 14 — record the outcome of a granted invocation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from warden.shared.canonical import canonical_json, compact_json, strict_loads
from warden.shared.codes import STAGES
from warden.shared.schema import redact
from warden_server.audit.events import AuditEvent, now_iso
from warden_server.auth.services import Service
from warden_server.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from warden_server.grants import GrantError
from warden_server.store import WriteTransaction

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


def complete(plane: Plane, request: CompleteRequest) -> int:
    """Append the outcome record; returns its sequence number.

    Raises:
        InvalidRequest: malformed fields.
        PermissionDenied: a forged grant, or another service's invocation (SI-7).
        NotFound: no such granted invocation.
        Conflict: the outcome was already reported.
    """
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
    capability = plane.registry.get(invocation.capability_id, invocation.capability_version)
    output = None
    if request.output_json:
        try:
            value = strict_loads(request.output_json)
            canonical_json(value)
        except ValueError as exc:
            raise InvalidRequest(f"output_json is not valid JSON: {exc}") from None
        schema = capability.definition.output_schema if capability else {}
        output = compact_json(redact(value, schema))
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
    )

    def work(tx: WriteTransaction) -> int:
        if not tx.complete_invocation(invocation.invocation_id, now_iso()):
            raise Conflict(f"the outcome of {invocation.invocation_id} was already reported")
        return tx.append_audit(event)

    return plane.store.transact(work)


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
