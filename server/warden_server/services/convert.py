"""Proto <-> domain conversion for the plane: the only place both meet."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from google.protobuf.timestamp_pb2 import Timestamp

from warden.shared.canonical import (
    JSONLimitError,
    NotCanonicalizable,
    canonical_json,
    compact_json,
    strict_loads,
)
from warden.v1 import (
    approvals_pb2,
    audit_pb2,
    errors_pb2,
    governor_pb2,
    grants_pb2,
    policy_pb2,
    registry_pb2,
)
from warden_server.audit.chain import VerifyResult
from warden_server.audit.reader import AuditFilter, Stats, StatsRow
from warden_server.config import LimitsSection
from warden_server.errors import InvalidRequest
from warden_server.limits import KeyUsage, LimitStatus
from warden_server.records.events import COLUMNS
from warden_server.records.query import Page
from warden_server.registry import (
    SURFACES,
    Capability,
    CapabilityDefinition,
    DeclaredError,
    recorded_capability_id,
    schema_from_json,
)

# Named in signatures only: the CLI's audit commands convert records without
# importing the plane.
if TYPE_CHECKING:
    from warden_server.approvals.deciding import ApprovalView
    from warden_server.auth.actors import Actor
    from warden_server.grants import PublishedKey
    from warden_server.pipeline.failure import Failure
    from warden_server.pipeline.idempotency import Replayed
    from warden_server.plane import PolicyStatus
    from warden_server.policy.engine import CompiledRule
    from warden_server.policy.loader import Problem
    from warden_server.store.records import ReplicaRecord

SIDE_EFFECTS = {
    registry_pb2.SIDE_EFFECT_READ: "read",
    registry_pb2.SIDE_EFFECT_WRITE: "write",
    registry_pb2.SIDE_EFFECT_IDEMPOTENT: "idempotent",
}
SIDE_EFFECT_NUMBERS = {name: number for number, name in SIDE_EFFECTS.items()}
APPROVAL_STATES = {
    approvals_pb2.APPROVAL_STATE_PENDING: "pending",
    approvals_pb2.APPROVAL_STATE_APPROVED: "approved",
    approvals_pb2.APPROVAL_STATE_DENIED: "denied",
    approvals_pb2.APPROVAL_STATE_EXPIRED: "expired",
    approvals_pb2.APPROVAL_STATE_CONSUMED: "consumed",
}
APPROVAL_STATE_NUMBERS = {name: number for number, name in APPROVAL_STATES.items()}
APPROVAL_EVENT_TYPES = {
    "requested": approvals_pb2.APPROVAL_EVENT_TYPE_REQUESTED,
    "approved": approvals_pb2.APPROVAL_EVENT_TYPE_APPROVED,
    "denied": approvals_pb2.APPROVAL_EVENT_TYPE_DENIED,
    "expired": approvals_pb2.APPROVAL_EVENT_TYPE_EXPIRED,
    "consumed": approvals_pb2.APPROVAL_EVENT_TYPE_CONSUMED,
    "pending": approvals_pb2.APPROVAL_EVENT_TYPE_PENDING,
}
OUTCOME_STATUSES = {
    governor_pb2.OUTCOME_STATUS_SUCCEEDED: "succeeded",
    governor_pb2.OUTCOME_STATUS_FAILED: "failed",
    governor_pb2.OUTCOME_STATUS_CANCELLED: "cancelled",
}
OUTCOME_STATUS_NUMBERS = {name: number for number, name in OUTCOME_STATUSES.items()}


def definition_from_proto(
    message: registry_pb2.CapabilityDefinition,
    max_schema_bytes: int = LimitsSection().max_schema_bytes,
) -> CapabilityDefinition:
    label = recorded_capability_id(message.id) or "<no id>"
    side_effect = SIDE_EFFECTS.get(message.side_effect)
    if side_effect is None:
        raise InvalidRequest(f"{label}: side_effect is required (read, write or idempotent)")
    return CapabilityDefinition(
        id=message.id,
        version=message.version,
        description=message.description,
        input_schema=schema_from_json(
            message.input_schema_json, f"{label}: input_schema_json", max_schema_bytes
        ),
        output_schema=schema_from_json(
            message.output_schema_json, f"{label}: output_schema_json", max_schema_bytes
        ),
        errors=tuple(DeclaredError(e.code, e.message, e.retryable) for e in message.errors),
        side_effect=side_effect,  # type: ignore[arg-type]
        timeout_ms=message.timeout_ms,
        exposure=tuple(message.exposure) or SURFACES,
        required_roles=tuple(message.required_roles),
        tags=tuple(message.tags),
    )


def capability_to_proto(capability: Capability) -> registry_pb2.Capability:
    d = capability.definition
    return registry_pb2.Capability(
        definition=registry_pb2.CapabilityDefinition(
            id=d.id,
            version=d.version,
            description=d.description,
            input_schema_json=compact_json(d.input_schema),
            output_schema_json=compact_json(d.output_schema),
            errors=[
                registry_pb2.DeclaredError(code=e.code, message=e.message, retryable=e.retryable)
                for e in d.errors
            ],
            side_effect=SIDE_EFFECT_NUMBERS[d.side_effect],
            timeout_ms=d.timeout_ms,
            exposure=list(d.exposure),
            required_roles=list(d.required_roles),
            tags=list(d.tags),
        ),
        service=capability.service,
        digest=capability.digest,
        registered_at=timestamp(datetime.fromisoformat(capability.registered_at)),
    )


def failure_to_proto(failure: Failure) -> errors_pb2.Failure:
    return errors_pb2.Failure(
        code=failure.code,
        stage=failure.stage,
        public_message=failure.public_message,
        retryable=failure.retryable,
        exposed=failure.exposed,
        details_json=compact_json(failure.details) if failure.details else "",
    )


def replay_to_proto(replay: Replayed) -> governor_pb2.Replay:
    message = governor_pb2.Replay(
        original_invocation_id=replay.original_invocation_id,
        status=OUTCOME_STATUS_NUMBERS[replay.status],
        output_json=replay.output_json,
        executed_before_failure=replay.executed_before_failure,
        completed_at=timestamp(replay.completed_at),
    )
    if replay.failure is not None:
        message.failure.CopyFrom(failure_to_proto(replay.failure))
    return message


def grant_key_to_proto(key: PublishedKey) -> grants_pb2.GrantKey:
    return grants_pb2.GrantKey(
        key_id=key.key_id,
        algorithm="EdDSA",
        public_key_pem=key.public_key_pem,
        signing=key.signing,
    )


def actor_to_proto(actor: Actor) -> governor_pb2.Actor:
    return governor_pb2.Actor(
        id=actor.id,
        roles=list(actor.roles),
        tenant=actor.tenant,
        attrs_json=compact_json(dict(actor.attrs)),
    )


def timestamp(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def surface_of(value: str) -> str:
    surface = value or "direct"
    if surface not in SURFACES:
        raise InvalidRequest(f"unknown surface {surface!r} (known: {', '.join(SURFACES)})")
    return surface


def context_of(text: str, max_bytes: int, field: str = "context_json") -> dict[str, Any]:
    """A JSON object sent as text (a call's context, a failure's details).

    Raises:
        InvalidRequest: larger than ``max_bytes``, not JSON, beyond the JSON
            limits (``strict_loads``), or not an object.
    """
    if not text:
        return {}
    if len(text) > max_bytes or len(text.encode()) > max_bytes:
        raise InvalidRequest(f"{field} is larger than {max_bytes} bytes")
    try:
        value = strict_loads(text)
    except JSONLimitError as exc:
        raise InvalidRequest(f"{field} {exc}") from None
    except ValueError as exc:
        raise InvalidRequest(f"{field} is not valid JSON: {exc}") from None
    try:
        canonical_json(value)
    except NotCanonicalizable:
        raise InvalidRequest(
            f"{field} has no canonical JSON form (RFC 8785): integers must be within "
            "±2^53 and text valid Unicode"
        ) from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{field} must be a JSON object")
    return value


def invocation_id_of(text: str, field: str = "invocation_id") -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise InvalidRequest(f"{field} must be a UUID") from None


def details_of(text: str, max_bytes: int) -> dict[str, Any] | None:
    if not text:
        return None
    return context_of(text, max_bytes, "failure.details_json")


def approval_states_of(values: Iterable[approvals_pb2.ApprovalState.ValueType]) -> list[str]:
    states = []
    for value in values:
        state = APPROVAL_STATES.get(value)
        if state is None:
            raise InvalidRequest(f"unknown approval state {value}")
        states.append(state)
    return states


def approval_to_proto(view: ApprovalView) -> approvals_pb2.Approval:
    a = view.approval
    message = approvals_pb2.Approval(
        id=a.approval_id,
        capability_id=a.capability_id,
        capability_version=a.capability_version,
        service=a.service,
        requester_id=a.requester_id,
        tenant=a.tenant,
        input_digest=a.input_digest,
        input_json=a.input,
        rule_id=a.rule_id,
        message=a.message,
        state=APPROVAL_STATE_NUMBERS[a.state],
        created_at=timestamp(datetime.fromisoformat(a.created_at)),
        expires_at=timestamp(datetime.fromisoformat(a.expires_at)),
        decided_by=a.decided_by or "",
        reason=a.reason or "",
        invocation_id=a.invocation_id or "",
        policy_revision=a.policy_revision or "",
        may_decide=view.may_decide,
    )
    if a.decided_at:
        message.decided_at.CopyFrom(timestamp(datetime.fromisoformat(a.decided_at)))
    return message


def approval_event_to_proto(kind: str, view: ApprovalView) -> approvals_pb2.ApprovalEvent:
    return approvals_pb2.ApprovalEvent(
        type=APPROVAL_EVENT_TYPES[kind], approval=approval_to_proto(view)
    )


def policy_status_to_proto(
    status: PolicyStatus,
    directory: str,
    watching: bool,
    replicas: Iterable[ReplicaRecord] = (),
    answering: str = "",
    *,
    include_rules: bool = False,
) -> policy_pb2.PolicyStatus:
    current = status.current
    message = policy_pb2.PolicyStatus(
        current=policy_pb2.PolicyRevision(
            revision=current.revision, files=list(current.files), at=timestamp(status.loaded_at)
        ),
        rules=len(current.rules),
        directory=directory,
        watching=watching,
    )
    rejected = status.rejected
    if rejected is not None:
        message.rejected.CopyFrom(
            policy_pb2.PolicyRevision(
                revision=rejected.revision, files=list(rejected.files), at=timestamp(rejected.at)
            )
        )
        message.problems.extend(problem_to_proto(p) for p in rejected.problems)
    if include_rules:
        message.rules_in_force.extend(rule_summary_to_proto(r) for r in current.rules)
    message.replicas.extend(replica_to_proto(r, answering) for r in replicas)
    return message


def replica_to_proto(record: ReplicaRecord, answering: str) -> policy_pb2.ReplicaStatus:
    message = policy_pb2.ReplicaStatus(
        id=record.replica_id,
        host=record.host,
        processes=record.processes,
        current=policy_pb2.PolicyRevision(
            revision=record.revision, at=timestamp(datetime.fromisoformat(record.loaded_at))
        ),
        registrations=record.registrations,
        leader=record.leader,
        seen_at=timestamp(datetime.fromisoformat(record.seen_at)),
        answering=record.replica_id == answering,
    )
    if record.refused_at is not None:
        message.rejected.CopyFrom(
            policy_pb2.PolicyRevision(
                revision=record.refused_revision or "",
                at=timestamp(datetime.fromisoformat(record.refused_at)),
            )
        )
    return message


def rule_summary_to_proto(compiled: CompiledRule) -> policy_pb2.PolicyRuleSummary:
    """A rule in force as its author wrote it (expressions before variables are written out)."""
    rule = compiled.rule
    return policy_pb2.PolicyRuleSummary(
        id=rule.id,
        file=compiled.file,
        line=compiled.line,
        effect=rule.effect,
        mode=rule.mode,
        capabilities=list(rule.capabilities),
        when=rule.when,
        message=rule.message or "",
        message_expr=rule.message_expr or "",
        approvers=rule.approvers or "",
        ttl=rule.ttl or "",
        description=rule.description or "",
    )


def problem_to_proto(problem: Problem) -> policy_pb2.PolicyProblem:
    return policy_pb2.PolicyProblem(
        file=problem.file,
        line=problem.line,
        column=problem.column,
        path=problem.path,
        message=problem.message,
    )


# -- the audit API (both sides: the servicer and the CLI's remote client) -------

_FLAGS = frozenset({"exposed", "retryable", "executed_before_failure"})


def audit_filter_from_proto(message: audit_pb2.AuditFilter) -> AuditFilter:
    return AuditFilter(
        since=message.since or None,
        until=message.until or None,
        capabilities=tuple(message.capabilities),
        actor=message.actor or None,
        tenant=message.tenant or None,
        stage=message.stage or None,
        code=message.code or None,
        status=message.status or None,
        kind=message.kind or None,
        invocation=message.invocation_id or None,
        seq=message.seq if message.HasField("seq") else None,
    )


def audit_filter_to_proto(f: AuditFilter) -> audit_pb2.AuditFilter:
    return audit_pb2.AuditFilter(
        since=f.since or "",
        until=f.until or "",
        capabilities=list(f.capabilities),
        actor=f.actor or "",
        tenant=f.tenant or "",
        stage=f.stage or "",
        code=f.code or "",
        status=f.status or "",
        kind=f.kind or "",
        invocation_id=f.invocation or "",
        seq=f.seq,
    )


def audit_record_to_proto(row: dict[str, Any]) -> audit_pb2.AuditRecord:
    """A store row as a record; NULL columns stay unset."""
    values: dict[str, Any] = {
        column: bool(value) if column in _FLAGS else value
        for column, value in row.items()
        if value is not None
    }
    return audit_pb2.AuditRecord(**values)


def audit_record_from_proto(message: audit_pb2.AuditRecord) -> dict[str, Any]:
    """A record as the store's row: the same keys and values the local reader gives."""
    row: dict[str, Any] = {}
    record: Any = message  # fields are read by column name
    for column in COLUMNS:
        field = record.DESCRIPTOR.fields_by_name[column]
        if field.has_presence and not record.HasField(column):
            row[column] = None
            continue
        value = getattr(record, column)
        row[column] = int(value) if column in _FLAGS else value
    return row


def page_to_proto(page: Page) -> audit_pb2.QueryResponse:
    return audit_pb2.QueryResponse(
        records=[audit_record_to_proto(row) for row in page.rows],
        next_page_token=str(page.next_before) if page.next_before is not None else "",
    )


def page_from_proto(response: audit_pb2.QueryResponse) -> Page:
    return Page(
        rows=[audit_record_from_proto(r) for r in response.records],
        next_before=page_token_of(response.next_page_token),
    )


def page_token_of(text: str) -> int | None:
    """A page token as the API issues them: a record's sequence number."""
    if not text:
        return None
    if text.isascii() and text.isdigit() and len(text) <= 19 and 0 < int(text) <= MAX_SEQ:
        return int(text)
    raise InvalidRequest(
        "page_token is not one this API issued (pass the next_page_token of the previous page)"
    )


MAX_SEQ = 2**63 - 1
"""The largest sequence number SQLite can hold."""


def stats_to_proto(stats: Stats) -> audit_pb2.StatsResponse:
    return audit_pb2.StatsResponse(
        by=stats.by,
        total=stats.total,
        window_seconds=stats.window_seconds,
        rows=[
            audit_pb2.StatsRow(key=r.key, count=r.count, share=r.share, per_minute=r.per_minute)
            for r in stats.rows
        ],
    )


def stats_from_proto(response: audit_pb2.StatsResponse) -> Stats:
    return Stats(
        by=response.by,
        total=response.total,
        window_seconds=response.window_seconds,
        rows=[
            StatsRow(
                key=r.key if r.HasField("key") else None,
                count=r.count,
                share=r.share,
                per_minute=r.per_minute if r.HasField("per_minute") else None,
            )
            for r in response.rows
        ],
    )


def limit_usage_to_proto(revision: str, report: list[LimitStatus]) -> audit_pb2.LimitUsageResponse:
    return audit_pb2.LimitUsageResponse(
        policy_revision=revision,
        limits=[
            audit_pb2.LimitStatus(
                limit_id=s.limit_id,
                kind=s.kind,
                mode=s.mode,
                capacity=s.capacity,
                period_seconds=s.period_seconds,
                file=s.file,
                line=s.line,
                keys=[
                    audit_pb2.LimitKeyUsage(
                        key=k.key, used=k.used, next_release_ms=k.next_release_ms
                    )
                    for k in s.keys
                ],
            )
            for s in report
        ],
    )


def limit_usage_from_proto(response: audit_pb2.LimitUsageResponse) -> list[LimitStatus]:
    return [
        LimitStatus(
            limit_id=s.limit_id,
            kind=s.kind,
            mode=s.mode,
            capacity=s.capacity,
            period_seconds=s.period_seconds,
            file=s.file,
            line=s.line,
            keys=tuple(KeyUsage(k.key, k.used, k.next_release_ms) for k in s.keys),
        )
        for s in response.limits
    ]


def verify_to_proto(result: VerifyResult) -> audit_pb2.VerifyResponse:
    return audit_pb2.VerifyResponse(
        ok=result.ok,
        checked=result.checked,
        first_bad_seq=result.first_bad_seq or 0,
        problem=result.problem or "",
        start_seq=result.start_seq,
    )


def verify_from_proto(response: audit_pb2.VerifyResponse) -> VerifyResult:
    return VerifyResult(
        ok=response.ok,
        checked=response.checked,
        first_bad_seq=response.first_bad_seq or None,
        problem=response.problem or None,
        start_seq=response.start_seq,
    )
