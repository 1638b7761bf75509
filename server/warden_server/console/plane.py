"""The console's one way to the plane: its gRPC APIs, with the signed-in
person's own token on every call, so the plane scopes and records each
answer exactly as it does for the CLI (SI-6, SI-13).

A refusal or an unreachable plane becomes ``PlaneRefused``, worded for a
person; no gRPC or Python text reaches a page.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

import warden
from warden.shared.reach import unreachable
from warden.shared.tls import TLS, credentials_of, sync_channel
from warden.shared.wire import ACTOR_TOKEN_METADATA, BEARER
from warden.v1 import audit_pb2, audit_pb2_grpc, policy_pb2, policy_pb2_grpc
from warden_server.audit.chain import VerifyResult
from warden_server.audit.reader import AuditFilter, Stats
from warden_server.records.query import Page
from warden_server.services import convert

T = TypeVar("T")

TIMEOUT_S = 10.0

_IN_WORDS = {
    "UNAUTHENTICATED": "The plane did not accept your token",
    "PERMISSION_DENIED": "Refused",
    "NOT_FOUND": "Not found",
    "FAILED_PRECONDITION": "Too late",
    "INVALID_ARGUMENT": "Not accepted",
    "RESOURCE_EXHAUSTED": "The plane is busy",
    "UNAVAILABLE": "The plane is unavailable",
}


class PlaneRefused(Exception):
    """The plane refused a call, or none answered; ``str()`` says why in words."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def headline(self) -> str:
        return _IN_WORDS.get(self.status, "The plane refused")


@dataclass(frozen=True, slots=True)
class PolicyProblem:
    file: str
    line: int
    column: int
    path: str
    message: str


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """One rule in force, as its author wrote it."""

    id: str
    file: str
    line: int
    effect: str
    mode: str
    capabilities: list[str]
    when: str
    message: str
    message_expr: str
    approvers: str
    ttl: str
    description: str


@dataclass(frozen=True, slots=True)
class PolicyStatus:
    revision: str
    files: list[str]
    loaded_at: str
    rules: int
    directory: str
    watching: bool
    rejected_revision: str | None
    rejected_at: str | None
    problems: list[PolicyProblem]
    rules_in_force: list[PolicyRule]


class Plane:
    """The plane at ``target``, reached over one channel shared by every
    session; each call carries the caller's token."""

    def __init__(self, target: str, tls: TLS | None = None) -> None:
        self.target = target
        self._tls = tls
        self._channel = sync_channel(target, credentials_of(tls))
        self._audit = audit_pb2_grpc.AuditStub(self._channel)
        self._policies = policy_pb2_grpc.PoliciesStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    # Approvals, through the SDK's approver client.

    def approvals(self, token: str) -> warden.Approvals:
        """An approver's client for one call or one watch; the caller closes it."""
        return warden.Approvals(self.target, token=token, tls=self._tls)

    def check_token(self, token: str) -> None:
        """Ask the plane whether it accepts ``token`` (any actor may list their
        tenant's approvals); PlaneRefused when it does not."""
        self._approving(token, lambda a: a.list(limit=1))

    def pending(self, token: str, limit: int = 200) -> list[warden.Approval]:
        return self._approving(token, lambda a: a.list(states=("pending",), limit=limit))

    def recent(self, token: str, limit: int = 20) -> list[warden.Approval]:
        states: tuple[Any, ...] = ("approved", "denied", "expired", "consumed")
        return self._approving(token, lambda a: a.list(states=states, limit=limit))

    def approval(self, token: str, approval_id: str) -> warden.Approval:
        return self._approving(token, lambda a: a.get(approval_id))

    def approve(self, token: str, approval_id: str, reason: str) -> warden.Approval:
        return self._approving(token, lambda a: a.approve(approval_id, reason=reason))

    def deny(self, token: str, approval_id: str, reason: str) -> warden.Approval:
        return self._approving(token, lambda a: a.deny(approval_id, reason=reason))

    def watch(
        self, token: str, stop: threading.Event, *, include_pending: bool = False
    ) -> Iterator[warden.ApprovalEvent]:
        """The tenant's approval events until ``stop`` is set or the plane ends the stream."""
        client = self.approvals(token)

        def close_when_stopped() -> None:
            stop.wait()
            client.close()

        closer = threading.Thread(target=close_when_stopped, daemon=True)
        closer.start()
        try:
            if stop.is_set():
                return  # the page went away before the watch began
            yield from client.watch(include_pending=include_pending)
        except warden.ApprovalError as exc:
            if not stop.is_set():
                raise PlaneRefused(
                    exc.status, _message(self.target, exc.status, str(exc))
                ) from None
        except ValueError:
            # grpc's "Cannot invoke RPC: Channel closed!": stopped (sign-out,
            # shutdown) just as the watch began. Otherwise it is a fault.
            if not stop.is_set():
                raise
        finally:
            stop.set()
            client.close()

    def _approving(self, token: str, call: Callable[[warden.Approvals], T]) -> T:
        client = self.approvals(token)
        try:
            return call(client)
        except warden.ApprovalError as exc:
            raise PlaneRefused(exc.status, _message(self.target, exc.status, str(exc))) from None
        finally:
            client.close()

    # The audit API.

    def query(self, token: str, f: AuditFilter, *, limit: int, before: int | None) -> Page:
        request = audit_pb2.QueryRequest(
            filter=convert.audit_filter_to_proto(f),
            limit=limit,
            page_token=str(before) if before is not None else "",
        )
        return convert.page_from_proto(self._call(self._audit.Query, request, token))

    def stats(self, token: str, by: str, f: AuditFilter) -> Stats:
        request = audit_pb2.StatsRequest(filter=convert.audit_filter_to_proto(f), by=by)
        return convert.stats_from_proto(self._call(self._audit.Stats, request, token))

    def verify(self, token: str) -> VerifyResult:
        request = audit_pb2.VerifyRequest()
        return convert.verify_from_proto(
            self._call(self._audit.Verify, request, token, timeout=120.0)
        )

    def export(self, token: str, f: AuditFilter) -> Iterator[dict[str, Any]]:
        """Every matching record, oldest first, as the plane streams them."""
        request = audit_pb2.ExportRequest(filter=convert.audit_filter_to_proto(f))
        try:
            for record in self._audit.Export(request, metadata=_metadata(token)):
                yield convert.audit_record_from_proto(record)
        except grpc.RpcError as exc:
            raise _refused(self.target, exc) from None

    # The policy API.

    def policy_status(self, token: str) -> PolicyStatus:
        status = self._call(
            self._policies.GetStatus,
            policy_pb2.PolicyStatusRequest(actor_token=token, include_rules=True),
            None,
        )
        current, rejected = status.current, status.rejected
        return PolicyStatus(
            revision=current.revision,
            files=list(current.files),
            loaded_at=_stamp(current.at) if current.HasField("at") else "",
            rules=status.rules,
            directory=status.directory,
            watching=status.watching,
            rejected_revision=rejected.revision if status.HasField("rejected") else None,
            rejected_at=_stamp(rejected.at) if status.HasField("rejected") else None,
            problems=[
                PolicyProblem(p.file, p.line, p.column, p.path, p.message) for p in status.problems
            ],
            rules_in_force=[
                PolicyRule(
                    id=r.id,
                    file=_within(r.file, status.directory),
                    line=r.line,
                    effect=r.effect,
                    mode=r.mode,
                    capabilities=list(r.capabilities),
                    when=r.when,
                    message=r.message,
                    message_expr=r.message_expr,
                    approvers=r.approvers,
                    ttl=r.ttl,
                    description=r.description,
                )
                for r in status.rules_in_force
            ],
        )

    def _call(
        self, method: Any, request: Any, token: str | None, timeout: float = TIMEOUT_S
    ) -> Any:
        try:
            return method(request, metadata=_metadata(token) if token else None, timeout=timeout)
        except grpc.RpcError as exc:
            raise _refused(self.target, exc) from None


def _metadata(token: str) -> tuple[tuple[str, str], ...]:
    return ((ACTOR_TOKEN_METADATA, f"{BEARER} {token}"),)


def _refused(target: str, exc: grpc.RpcError) -> PlaneRefused:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or "no answer"
    status = code.name if code is not None else "UNAVAILABLE"
    return PlaneRefused(status, unreachable(target, code, details) or details)


def _message(target: str, status: str, message: str) -> str:
    code = getattr(grpc.StatusCode, status, None)
    return unreachable(target, code, message) or message


def _within(file: str, directory: str) -> str:
    """A policy file's path relative to the policy folder, when it is in it."""
    inside = file.removeprefix(directory.rstrip("/") + "/")
    return inside if directory and inside != file else file


def _stamp(at: Any) -> str:
    return str(at.ToDatetime().isoformat(timespec="seconds")) + "Z"
