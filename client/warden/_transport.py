"""The one place gRPC meets the SDK: asyncio stubs per event loop, blocking
stubs for the outbox's reports, and the mapping from gRPC status to the SDK's
errors. No ``grpc.RpcError`` leaves this module."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Generic, TypeVar

import grpc
import grpc.aio

from warden._errors import ApprovalError, CapabilityError, WardenError
from warden._grants import GrantKey
from warden._tracing import trace_metadata
from warden.shared.reach import unreachable
from warden.shared.tls import TLS, TLSConfigError, aio_channel, credentials_of, sync_channel
from warden.shared.wire import (
    ACTOR_TOKEN_METADATA,
    BEARER,
    PROCESS_METADATA,
    SERVICE_TOKEN_METADATA,
)
from warden.v1 import (
    approvals_pb2,
    approvals_pb2_grpc,
    governor_pb2,
    governor_pb2_grpc,
    grants_pb2,
    grants_pb2_grpc,
    registry_pb2,
    registry_pb2_grpc,
)

T = TypeVar("T")

CHANNEL_OPTIONS = (
    # A plane that restarts is back within moments: reconnect on that scale,
    # not after gRPC's default backoff of a second and more. Not
    # grpc.min_reconnect_backoff_ms: gRPC also takes it as the time a
    # connection attempt may last, and a busy plane that took longer than
    # that to answer a new connection failed the call at once.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # A runtime keeps a connection of its own. gRPC otherwise shares one
    # between every channel to the same target in a process, and a plane of
    # several processes is spread by connection: all of them would reach one.
    ("grpc.use_local_subchannel_pool", 1),
)

_TRANSIENT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED}
)


class _Connection:
    """One connection to the plane, and how fast it has been answering."""

    def __init__(self) -> None:
        self.in_flight = 0
        """Calls sent on this connection and not answered yet."""
        self.process: str | None = None
        """The plane's process this connection reached, once it has said (``x-warden-process``)."""
        self._latency_s = 0.0
        self._latency_at = 0.0

    def latency_s(self, now: float) -> float:
        """The recent round-trip time: the peak of the last answers, fading
        towards zero while none comes, so a connection left aside is tried again."""
        return self._latency_s * math.exp((self._latency_at - now) / LATENCY_DECAY_S)

    def answered(self, seconds: float, now: float) -> None:
        """Account for an answer that took ``seconds``: a slower answer counts in
        full at once, a faster one is averaged in (a peak EWMA)."""
        weight = math.exp((self._latency_at - now) / LATENCY_DECAY_S)
        recent = self._latency_s * weight
        self._latency_s = seconds if seconds > recent else recent * weight + seconds * (1 - weight)
        self._latency_at = now

    def heard_from(self, trailing_metadata: Any) -> None:
        """Learn which process answered (``x-warden-process``) from an answer's trailers."""
        for key, value in trailing_metadata or ():
            if key == PROCESS_METADATA and isinstance(value, str):
                self.process = value

    async def close(self) -> None:
        raise NotImplementedError


class _Stubs(_Connection):
    """An asyncio connection and its stubs."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__()
        self.channel = channel
        self.governor = governor_pb2_grpc.GovernorStub(channel)
        self.registry = registry_pb2_grpc.RegistryStub(channel)
        self.grant_keys = grants_pb2_grpc.GrantKeysStub(channel)

    async def close(self) -> None:
        await self.channel.close(grace=None)


class _BlockingStubs(_Connection):
    """A connection of gRPC's blocking API and its Governor stub."""

    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__()
        self.channel = channel
        self.governor = governor_pb2_grpc.GovernorStub(channel)

    async def close(self) -> None:
        self.channel.close()


C = TypeVar("C", bound=_Connection)


CONNECTIONS = 8
"""Connections a runtime opens to the plane (per event loop). The kernel
spreads connections, not calls, over a plane's processes; with eight, all of
them reach one of two processes once in 128 runtimes (once in 8 with four),
and the balancer evens out the rest."""
LATENCY_DECAY_S = 2.0
"""How fast a connection's latency fades when it is not measured again."""
LATENCY_FLOOR_S = 0.001
"""The least latency a connection is credited with, so that a connection that
has not answered yet still counts the calls it carries."""


class _Pool(Generic[C]):
    """A runtime's connections to the plane (those of one event loop, or the outbox's).

    A call goes to the connection where it is expected to be answered soonest:
    the least recent latency times the calls in flight to the same process of
    the plane (the peak-EWMA balancer of Finagle and Linkerd, counted by
    process), in turn among equals. The kernel hands a service's connections
    to a plane's processes unevenly (three of four to one process is as likely
    as two and two): dealt out in turn, three quarters of the calls would
    queue at one process while the other idled, and counted by connection,
    the process holding three would still get more than its share. Which
    process a connection reached, the plane says in each answer.

    A process's latency is that of its slowest connection: a connection left
    aside fades towards zero, and taken alone it would make its process look
    fast while the calls there wait their turn (each fresh call would go to
    it until its first answer came back, a queue's length later).
    """

    def __init__(self, connections: Sequence[C]) -> None:
        self._stubs = list(connections)
        self._turn = itertools.count()

    @property
    def connections(self) -> list[C]:
        return list(self._stubs)

    def next(self, now: float | None = None) -> C:
        """The connection for the next call."""
        now = time.monotonic() if now is None else now
        carried: dict[str, int] = {}
        slowest: dict[str, float] = {}
        for stubs in self._stubs:
            if stubs.process is not None:
                carried[stubs.process] = carried.get(stubs.process, 0) + stubs.in_flight
                latency = stubs.latency_s(now)
                slowest[stubs.process] = max(slowest.get(stubs.process, 0.0), latency)
        count = len(self._stubs)
        start = next(self._turn)
        chosen, least = self._stubs[0], (math.inf, 0)
        for step in range(count):
            stubs = self._stubs[(start + step) % count]
            if stubs.process is None:
                queued, latency = stubs.in_flight, stubs.latency_s(now)
            else:
                queued, latency = carried[stubs.process], slowest[stubs.process]
            cost = (max(latency, LATENCY_FLOOR_S) * (queued + 1), stubs.in_flight)
            if cost < least:
                chosen, least = stubs, cost
        return chosen

    async def close(self) -> None:
        for stubs in self._stubs:
            await stubs.close()


def _aio_pool(target: str, credentials: grpc.ChannelCredentials | None) -> _Pool[_Stubs]:
    return _Pool(
        [_Stubs(aio_channel(target, credentials, CHANNEL_OPTIONS)) for _ in range(CONNECTIONS)]
    )


def _blocking_pool(
    target: str, credentials: grpc.ChannelCredentials | None
) -> _Pool[_BlockingStubs]:
    return _Pool(
        [
            _BlockingStubs(sync_channel(target, credentials, CHANNEL_OPTIONS))
            for _ in range(CONNECTIONS)
        ]
    )


class _ServiceAccess:
    """What a service's calls to the plane carry: its token, the governance
    timeout, and the TLS credentials read once."""

    def __init__(
        self, target: str, token: str, *, timeout_s: float, tls: TLS | None = None
    ) -> None:
        self.target = target
        self._metadata = ((SERVICE_TOKEN_METADATA, token),)
        self._timeout_s = timeout_s
        self._credentials = _credentials(tls)


class Transport(_ServiceAccess):
    """gRPC access to the plane: a few asyncio connections per event loop, and
    a few blocking ones for ``Begin`` from threads that wait anyway."""

    def __init__(
        self, target: str, token: str, *, timeout_s: float, tls: TLS | None = None
    ) -> None:
        super().__init__(target, token, timeout_s=timeout_s, tls=tls)
        self._pools: dict[asyncio.AbstractEventLoop, _Pool[_Stubs]] = {}
        self._blocking: _Pool[_BlockingStubs] | None = None
        self._blocking_lock = threading.Lock()
        """Guards the blocking pool: any thread may call ``begin_blocking``."""

    def _for_loop(self) -> _Stubs:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            for stale in [lp for lp in self._pools if lp.is_closed()]:
                del self._pools[stale]
            pool = self._pools[loop] = _aio_pool(self.target, self._credentials)
        return pool.next()

    async def begin(self, request: governor_pb2.BeginRequest) -> governor_pb2.BeginResponse:
        """Begin; raises CapabilityError(GOVERNANCE_UNAVAILABLE) when the plane
        cannot answer (fail closed), INPUT_INVALID when it would not read a
        request that large (``too_large``)."""
        try:
            return await self._governed(
                lambda stubs: stubs.governor.Begin(
                    request, metadata=self._metadata + trace_metadata(), timeout=self._timeout_s
                )
            )
        except CapabilityError as error:
            raise too_large(error) from None

    def begin_blocking(self, request: governor_pb2.BeginRequest) -> governor_pb2.BeginResponse:
        """``begin`` from a thread that waits for the answer anyway (``Runtime.invoke``):
        no event loop on the way there or back."""
        with self._blocking_lock:
            if self._blocking is None:
                self._blocking = _blocking_pool(self.target, self._credentials)
            stubs = self._blocking.next()
            stubs.in_flight += 1
        sent = time.monotonic()
        try:
            answer, call = stubs.governor.Begin.with_call(
                request, metadata=self._metadata + trace_metadata(), timeout=self._timeout_s
            )
        except grpc.RpcError as exc:
            error = governance_error(exc.code(), exc.details() or "", self.target)
            raise too_large(error) from None
        else:
            stubs.heard_from(call.trailing_metadata())
            return answer
        finally:
            now = time.monotonic()
            with self._blocking_lock:
                stubs.in_flight -= 1
                stubs.answered(now - sent, now)

    async def register(
        self, request: registry_pb2.RegisterRequest
    ) -> registry_pb2.RegisterResponse:
        """Register; raises WardenError with the plane's message when refused."""
        stubs = self._for_loop()
        try:
            response: registry_pb2.RegisterResponse = await stubs.registry.Register(
                request, metadata=self._metadata, timeout=self._timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            unreached = unreachable(self.target, exc.code(), exc.details() or "")
            raise WardenError(
                f"registration failed: {unreached}"
                if unreached
                else f"registration with {self.target} failed ({exc.code().name}): {exc.details()}",
                transient=exc.code() in _TRANSIENT,
            ) from None
        return response

    async def grant_keys(self) -> list[GrantKey]:
        """The plane's published grant keys; raises WardenError when it cannot be asked."""
        stubs = self._for_loop()
        try:
            response: grants_pb2.ListGrantKeysResponse = await stubs.grant_keys.ListGrantKeys(
                grants_pb2.ListGrantKeysRequest(), timeout=self._timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise WardenError(
                f"listing grant keys at {self.target} failed ({exc.code().name}): {exc.details()}",
                transient=exc.code() in _TRANSIENT,
            ) from None
        return [GrantKey(k.key_id, k.public_key_pem, k.signing) for k in response.keys]

    async def list_capabilities(
        self, request: registry_pb2.ListCapabilitiesRequest
    ) -> registry_pb2.ListCapabilitiesResponse:
        """Discovery for an actor; raises CapabilityError: UNAUTHENTICATED when
        the plane refused a token, GOVERNANCE_UNAVAILABLE otherwise."""
        stubs = self._for_loop()
        call = stubs.registry.ListCapabilities(
            request, metadata=self._metadata, timeout=self._timeout_s
        )
        try:
            response: registry_pb2.ListCapabilitiesResponse = await call
        except grpc.aio.AioRpcError as exc:
            cause = PlaneRefusedError(exc.code().name, exc.details() or "", self.target)
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                # Unlike Begin, which answers a refused actor as a governed
                # failure, discovery can only refuse the call itself.
                raise CapabilityError("UNAUTHENTICATED", cause=cause) from None
            raise governance_error(exc.code(), exc.details() or "", self.target) from None
        return response

    async def _governed(self, call: Callable[[_Stubs], grpc.aio.UnaryUnaryCall[Any, T]]) -> T:
        stubs = self._for_loop()
        stubs.in_flight += 1
        sent = time.monotonic()
        try:
            rpc = call(stubs)
            answer = await rpc
            stubs.heard_from(await rpc.trailing_metadata())
            return answer
        except grpc.aio.AioRpcError as exc:
            raise governance_error(exc.code(), exc.details() or "", self.target) from None
        finally:
            stubs.in_flight -= 1
            now = time.monotonic()
            stubs.answered(now - sent, now)

    async def aclose(self) -> None:
        """Close the connections of the running loop."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()

    def close_blocking(self) -> None:
        """Close the blocking connections."""
        with self._blocking_lock:
            pool, self._blocking = self._blocking, None
        if pool is not None:
            for stubs in pool.connections:
                stubs.channel.close()


class ReportTransport(_ServiceAccess):
    """Outcome reports to the plane, from the outbox's own event loop, through
    connections of gRPC's blocking API.

    grpc.aio hands every completion of the process to one poller thread, which
    wakes each event loop that ever made an asyncio call (grpcio 1.85): an
    outbox loop with asyncio connections would be woken by every ``Begin`` of
    the runtime's loop, taking the interpreter each time, and sometimes
    forward the answer to it, one more switch between threads on the call's
    way. A blocking channel's call completes on gRPC's own thread, which wakes
    the outbox's loop for its own answers only.
    """

    def __init__(
        self, target: str, token: str, *, timeout_s: float, tls: TLS | None = None
    ) -> None:
        super().__init__(target, token, timeout_s=timeout_s, tls=tls)
        self._pool: _Pool[_BlockingStubs] | None = None

    async def complete(
        self, request: governor_pb2.CompleteRequest, trace: tuple[tuple[str, str], ...]
    ) -> governor_pb2.CompleteResponse:
        """Complete, in the trace of its invocation (``trace_metadata()`` where it ran)."""
        return await self._governed(
            lambda stubs: stubs.governor.Complete.future(
                request, metadata=self._metadata + trace, timeout=self._timeout_s
            )
        )

    async def complete_many(
        self, reports: list[governor_pb2.OutcomeReport]
    ) -> governor_pb2.CompleteManyResponse:
        """CompleteMany: each report carries its own invocation's trace context."""
        request = governor_pb2.CompleteManyRequest(reports=reports)
        return await self._governed(
            lambda stubs: stubs.governor.CompleteMany.future(
                request, metadata=self._metadata, timeout=self._timeout_s
            )
        )

    async def _governed(self, call: Callable[[_BlockingStubs], grpc.CallFuture[T]]) -> T:
        """Make ``call`` (a ``future()`` of the blocking API) and await its
        answer on the running loop, as ``Transport._governed`` does."""
        if self._pool is None:
            self._pool = _blocking_pool(self.target, self._credentials)
        stubs = self._pool.next()
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()

        def settle(_: object) -> None:  # on gRPC's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(_settle, answered)

        stubs.in_flight += 1
        sent = time.monotonic()
        try:
            rpc = call(stubs)
            rpc.add_done_callback(settle)
            try:
                await answered
            except asyncio.CancelledError:
                rpc.cancel()  # type: ignore[no-untyped-call]  # untyped in grpc-stubs
                raise
            try:
                answer = rpc.result()
            except grpc.RpcError as exc:
                raise governance_error(exc.code(), exc.details() or "", self.target) from None
            stubs.heard_from(rpc.trailing_metadata())
            return answer
        finally:
            stubs.in_flight -= 1
            now = time.monotonic()
            stubs.answered(now - sent, now)

    async def aclose(self) -> None:
        """Close the connections."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()


def _settle(answered: asyncio.Future[None]) -> None:
    if not answered.done():  # else cancelled: nobody waits
        answered.set_result(None)


class PlaneRefusedError(Exception):
    """The plane answered a governed call with a gRPC error (kept as a cause)."""

    def __init__(self, code: str, details: str, target: str) -> None:
        super().__init__(f"{target} answered {code}: {details}")
        self.code = code
        self.details = details


TOO_LARGE: Final = "is larger than the plane reads"


def too_large(error: CapabilityError) -> CapabilityError:
    """A Begin the plane's gRPC server would not read, for its size: the input
    (the rest of a request is bounded), so INPUT_INVALID, which the model can
    act on, and not GOVERNANCE_UNAVAILABLE. gRPC refused it before the plane
    saw it: no record of it is written (docs/limits.md)."""
    cause = error.cause
    if (
        isinstance(cause, PlaneRefusedError)
        and cause.code == "RESOURCE_EXHAUSTED"
        and "larger than max" in cause.details
    ):
        issue = {"path": "", "message": TOO_LARGE}
        return CapabilityError("INPUT_INVALID", details={"issues": [issue]}, cause=cause)
    return error


def governance_error(code: grpc.StatusCode, details: str, target: str) -> CapabilityError:
    """The SDK's one mapping from a gRPC status to a model-facing error.

    Every status fails closed as GOVERNANCE_UNAVAILABLE; it is retryable only
    when another attempt could succeed (the plane down or slow), not when the
    plane refused the service or the request.
    """
    return CapabilityError(
        "GOVERNANCE_UNAVAILABLE",
        retryable=code in _TRANSIENT,
        cause=PlaneRefusedError(code.name, details, target),
    )


class ApprovalsTransport:
    """Synchronous gRPC access to the Approvals service with an approver's JWT."""

    def __init__(
        self, target: str, token: str, *, timeout_s: float, tls: TLS | None = None
    ) -> None:
        self.target = target
        self._metadata = ((ACTOR_TOKEN_METADATA, f"{BEARER} {token}"),)
        self._timeout_s = timeout_s
        self._channel = sync_channel(target, _credentials(tls))
        self._stub = approvals_pb2_grpc.ApprovalsStub(self._channel)

    def list(self, request: approvals_pb2.ListApprovalsRequest) -> list[approvals_pb2.Approval]:
        response: approvals_pb2.ListApprovalsResponse = self._call(
            lambda: self._stub.ListApprovals(
                request, metadata=self._metadata, timeout=self._timeout_s
            )
        )
        return list(response.approvals)

    def get(self, approval_id: str) -> approvals_pb2.Approval:
        request = approvals_pb2.GetApprovalRequest(id=approval_id)
        response: approvals_pb2.GetApprovalResponse = self._call(
            lambda: self._stub.GetApproval(
                request, metadata=self._metadata, timeout=self._timeout_s
            )
        )
        return response.approval

    def approve(self, approval_id: str, reason: str) -> approvals_pb2.Approval:
        request = approvals_pb2.ApproveRequest(id=approval_id, reason=reason)
        response: approvals_pb2.ApproveResponse = self._call(
            lambda: self._stub.Approve(request, metadata=self._metadata, timeout=self._timeout_s)
        )
        return response.approval

    def deny(self, approval_id: str, reason: str) -> approvals_pb2.Approval:
        request = approvals_pb2.DenyRequest(id=approval_id, reason=reason)
        response: approvals_pb2.DenyResponse = self._call(
            lambda: self._stub.Deny(request, metadata=self._metadata, timeout=self._timeout_s)
        )
        return response.approval

    def watch(self, include_pending: bool) -> Iterator[approvals_pb2.ApprovalEvent]:
        """The event stream; closing the iterator cancels the call."""
        call = self._stub.Watch(
            approvals_pb2.WatchApprovalsRequest(include_pending=include_pending),
            metadata=self._metadata,
        )
        try:
            yield from call
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise approval_error(exc, self.target) from None
        finally:
            call.cancel()  # type: ignore[no-untyped-call]  # untyped in grpc-stubs

    def _call(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except grpc.RpcError as exc:
            raise approval_error(exc, self.target) from None

    def close(self) -> None:
        self._channel.close()


def approval_error(exc: grpc.RpcError, target: str) -> ApprovalError:
    """The SDK's one mapping from a gRPC status to an approver-facing error."""
    code: grpc.StatusCode = exc.code()
    details = exc.details() or ""
    details = unreachable(target, code, details) or details
    return ApprovalError(code.name, details, transient=code in _TRANSIENT)


def _credentials(tls: TLS | None) -> grpc.ChannelCredentials | None:
    """Read the TLS files once, when the client is made: a bad file is a
    developer's error, not a governed failure."""
    try:
        return credentials_of(tls)
    except TLSConfigError as exc:
        raise WardenError(str(exc)) from None
