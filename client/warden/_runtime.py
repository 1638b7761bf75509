"""The Runtime: register capabilities, and invoke them under governance.

``invoke`` runs a call as one or more attempts (``_execution``): each asks the
plane for the pre-execution stages (``Begin``), runs the handler locally
within its time budget, classifies what it raised, validates its output and
hands the outcome to the outbox (``_outbox``), which reports it (``Complete``)
in the background until the plane has it. A failed attempt is retried only
when that is honest (SI-11, ``_retry``). Governed failures come back as
envelopes, never as exceptions.

``ainvoke`` waits on the caller's event loop. ``invoke`` of a synchronous
handler waits by blocking its calling thread, with no event loop on the way;
otherwise it runs on the runtime's own loop thread (``_LoopThread``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, TypeVar

from pydantic import BaseModel

from warden._cancel import CancelToken
from warden._capability import (
    SURFACES,
    CapabilitySpec,
    DiscoveredCapability,
    ErrorSpec,
    SideEffect,
    build_spec,
    discovered_from_proto,
)
from warden._context import Authorizer
from warden._envelope import Envelope
from warden._errors import CapabilityError, WardenError
from warden._execution import (
    AttemptRunner,
    BlockingWaits,
    LoopWaits,
    Waits,
    run_to_end,
    uncancel,
)
from warden._grants import GrantKey
from warden._handlers import HandlerThreads
from warden._outbox import Outbox, default_outbox_path
from warden._retry import RetryPolicy, may_retry
from warden._tracing import in_invocation_trace
from warden._transport import ReportTransport, Transport
from warden.shared.ids import uuid7
from warden.shared.tls import TLS
from warden.shared.wire import MAX_IDEMPOTENCY_KEY
from warden.v1 import governor_pb2, registry_pb2

log = logging.getLogger("warden")
F = TypeVar("F", bound=Callable[..., Any])
A = TypeVar("A", bound=Authorizer)
T = TypeVar("T")

REGISTER_AT_ONCE: Final = 100
"""Capabilities sent in one Register call: the plane's default limit."""


@dataclass(frozen=True, slots=True)
class _Call:
    """One logical call: what every attempt of it sends."""

    capability_id: str
    input_json: str
    actor: str
    context_json: str
    surface: str
    approval_id: str
    idempotency_key: str
    timeout_ms: int
    retry: RetryPolicy
    call_id: str = field(default_factory=lambda: str(uuid7()))


@dataclass(frozen=True, slots=True)
class RegisteredCapability:
    """What the plane recorded for one of this runtime's capabilities."""

    id: str
    version: str
    digest: str


class _LoopThread:
    """A private event loop on a daemon thread, for the synchronous API."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="warden-sdk-loop", daemon=True
        )
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop in the caller's context (its contextvars,
        and so its current trace span), and wait for the result.

        A KeyboardInterrupt or SystemExit the coroutine raises (a handler that
        calls ``sys.exit()``) is raised here, in the caller's thread: raised on
        the loop, it would stop the loop, and with it every call waiting there.
        """
        caller = contextvars.copy_context()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def start() -> None:
            task = self.loop.create_task(_contained(coroutine), context=caller)
            task.add_done_callback(functools.partial(_settle, done))

        self.loop.call_soon_threadsafe(start)
        try:
            return done.result()
        except _Interruption as interruption:
            raise interruption.raised from None

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


async def _to_the_end(invocation: Coroutine[Any, Any, Envelope]) -> Envelope:
    """Await an invocation in a task of its own, so it ends as the runtime means it
    to even when the caller is cancelled.

    A cancelled caller cancels the invocation once; the invocation then answers
    ``cancelled`` and reports its outcome (SI-3). Hosts with level-triggered
    cancellation (anyio cancel scopes, as in Starlette or the MCP SDK) cancel
    again at every await; those repeats are absorbed here instead of cutting
    the closing of a grant short. A cancellation that arrives before anything
    ran still propagates.

    A KeyboardInterrupt or SystemExit the invocation raises (its handler's)
    is raised here, once, in the caller's task: raised by a task of its own,
    asyncio would also raise it out of the caller's loop, past any ``except``
    of the caller's.
    """
    task = asyncio.ensure_future(_contained(invocation))
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            uncancel()
            if not cancelled:
                cancelled = True
                task.cancel()
    try:
        return task.result()
    except _Interruption as interruption:
        raise interruption.raised from None


class _Interruption(Exception):
    """A KeyboardInterrupt or SystemExit on its way from the loop thread to the caller's."""

    def __init__(self, raised: KeyboardInterrupt | SystemExit) -> None:
        super().__init__(repr(raised))
        self.raised = raised


async def _contained(coroutine: Coroutine[Any, Any, T]) -> T:
    """``coroutine``, with the interruptions an event loop lets through wrapped
    as an ordinary exception, so that the loop goes on."""
    try:
        return await coroutine
    except (KeyboardInterrupt, SystemExit) as raised:
        raise _Interruption(raised) from None


def _settle(done: concurrent.futures.Future[T], task: asyncio.Task[T]) -> None:
    if task.cancelled():
        done.cancel()
    elif (error := task.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(task.result())


class Runtime:
    """A service's connection to the plane and the capabilities it serves.

    Args:
        target: The plane's ``host:port``.
        service: The service's name, as configured in the plane.
        token: The service's token (from the environment or a secret store).
        governance_timeout_ms: How long to wait for the plane before failing
            closed with GOVERNANCE_UNAVAILABLE.
        max_handler_threads: Threads that run synchronous handlers.
        retry: How calls retry by default (``RetryPolicy()``: up to three
            attempts); ``warden.NO_RETRY`` turns automatic retries off.
        tls: How to reach a plane that serves TLS (``warden.TLS``); plaintext when None.
        outbox: Where outcome reports wait until the plane takes them. True (the
            default): a file per service under the user's state folder
            (``$XDG_STATE_HOME/warden/``, else ``~/.local/state/warden/``);
            a path: that file; False: memory only, so reports the plane has not
            taken when the process ends are lost.

    Raises:
        WardenError: the outbox file given cannot be opened.
    """

    def __init__(
        self,
        target: str,
        *,
        service: str,
        token: str,
        governance_timeout_ms: int = 5_000,
        max_handler_threads: int = 32,
        retry: RetryPolicy | None = None,
        tls: TLS | None = None,
        outbox: bool | str | os.PathLike[str] = True,
    ) -> None:
        self.target = target
        self.service = service
        self.retry = retry or RetryPolicy()
        self._wait_s = governance_timeout_ms / 1000
        self._transport = Transport(target, token, timeout_s=self._wait_s, tls=tls)
        # The outbox sends from a thread of its own, with connections of its own.
        reporting = ReportTransport(target, token, timeout_s=self._wait_s, tls=tls)
        self._outbox = _open_outbox(reporting, service, outbox)
        self._capabilities: dict[str, CapabilitySpec] = {}
        self._versions: dict[str, str] = {}
        self._registered = False
        self._handler_threads = HandlerThreads(max_handler_threads)
        self._authorizers: list[Authorizer] = []
        self._attempts = AttemptRunner(self._outbox, self._authorizers)
        self._loop_waits = LoopWaits(
            self._transport, self._outbox, self._handler_threads, self._wait_s
        )
        self._blocking_waits = BlockingWaits(
            self._transport, self._outbox, self._handler_threads, self._wait_s, self._sync
        )
        self._loop_thread: _LoopThread | None = None
        self._loop_lock = threading.Lock()

    # -- definition --------------------------------------------------------

    def capability(
        self,
        id: str,
        *,
        input: type[BaseModel],
        output: type[BaseModel],
        side_effect: SideEffect = "write",
        errors: Mapping[str, ErrorSpec] | None = None,
        timeout_ms: int | None = None,
        exposure: Sequence[str] | None = None,
        required_roles: Sequence[str] = (),
        tags: Sequence[str] = (),
        description: str | None = None,
        version: str | None = None,
        authorize: Authorizer | None = None,
    ) -> Callable[[F], F]:
        """Declare a capability served by the decorated handler.

        The handler receives the validated input model and a ``Context`` and
        returns the output model. ``side_effect`` defaults to ``write``, the
        assumption that never retries on its own; ``exposure`` defaults to
        every surface; ``description`` to the handler's docstring.
        ``authorize`` is app middleware for this capability alone (see
        ``authorizer``).
        """

        def decorate(handler: F) -> F:
            if id in self._capabilities:
                raise WardenError(f"capability {id!r} is already defined on this runtime")
            self._capabilities[id] = build_spec(
                id,
                handler,
                input=input,
                output=output,
                side_effect=side_effect,
                errors=errors,
                timeout_ms=timeout_ms,
                exposure=exposure,
                required_roles=required_roles,
                tags=tags,
                description=description,
                version=version,
                authorize=authorize,
            )
            self._registered = False
            return handler

        return decorate

    def authorizer(self, check: A) -> A:
        """Register app middleware that runs for every capability of this runtime.

        Pipeline step 6 on the service's side: after the plane granted the call
        and before the handler runs, each authorizer (this runtime's, then the
        capability's own) gets the validated input and the ``Context`` and
        returns True to let the handler run. False refuses with FORBIDDEN at
        stage ``authorization``; an exception fails closed as a concealed
        INTERNAL_ERROR. Either way the handler does not run and the outcome is
        audited. Async authorizers may await I/O; synchronous ones should be quick.
        """
        self._authorizers.append(check)
        return check

    @property
    def capabilities(self) -> Mapping[str, CapabilitySpec]:
        return dict(self._capabilities)

    # -- registration ------------------------------------------------------

    def register(self) -> list[RegisteredCapability]:
        """Register every capability of this runtime with the plane.

        Raises:
            WardenError: the plane refused (the message says why) or is unreachable.
        """
        return self._sync(self.aregister())

    async def aregister(self) -> list[RegisteredCapability]:
        """The async twin of ``register``."""
        if not self._capabilities:
            raise WardenError("no capabilities to register: decorate handlers first")
        definitions = [spec.to_proto() for spec in self._capabilities.values()]
        registered: list[RegisteredCapability] = []
        # A plane takes at most 100 per call by default ([limits]
        # max_capabilities_per_register); each call registers all or nothing.
        for start in range(0, len(definitions), REGISTER_AT_ONCE):
            request = registry_pb2.RegisterRequest(
                capabilities=definitions[start : start + REGISTER_AT_ONCE]
            )
            response = await self._transport.register(request)
            registered += [
                RegisteredCapability(c.definition.id, c.definition.version, c.digest)
                for c in response.capabilities
            ]
        self._versions = {r.id: r.version for r in registered}
        self._registered = True
        return registered

    # -- invocation --------------------------------------------------------

    def invoke(
        self,
        capability_id: str,
        input: Mapping[str, Any] | BaseModel | str,
        *,
        actor: str | None,
        context: Mapping[str, Any] | None = None,
        surface: str = "direct",
        approval_id: str | None = None,
        idempotency_key: str | None = None,
        timeout_ms: int | None = None,
        retry: RetryPolicy | None = None,
        cancel: CancelToken | None = None,
    ) -> Envelope:
        """Invoke a capability for an actor; see ``ainvoke``."""
        call = self._new_call(
            capability_id,
            input,
            actor=actor,
            context=context,
            surface=surface,
            approval_id=approval_id,
            idempotency_key=idempotency_key,
            timeout_ms=timeout_ms,
            retry=retry,
        )
        if cancel is None and self._runs_blocking(capability_id):
            # This thread waits anyway: the attempt runs on it, with no event loop.
            return run_to_end(self._traced_call(call, None, self._blocking_waits))
        # The task the loop thread runs it in is this call's alone: no caller
        # can cancel it but through ``cancel``, so it needs no shelter (``_to_the_end``).
        return self._sync(self._traced_call(call, cancel, self._loop_waits))

    def _runs_blocking(self, capability_id: str) -> bool:
        """Whether a call can wait by blocking its caller's thread: its handler,
        if served here, is synchronous, and registering is not due (that takes
        the event loop)."""
        spec = self._capabilities.get(capability_id)
        return (spec is None or not spec.is_async) and (self._registered or not self._capabilities)

    @in_invocation_trace
    async def ainvoke(
        self,
        capability_id: str,
        input: Mapping[str, Any] | BaseModel | str,
        *,
        actor: str | None,
        context: Mapping[str, Any] | None = None,
        surface: str = "direct",
        approval_id: str | None = None,
        idempotency_key: str | None = None,
        timeout_ms: int | None = None,
        retry: RetryPolicy | None = None,
        cancel: CancelToken | None = None,
    ) -> Envelope:
        """Invoke a capability for an actor under governance.

        Args:
            capability_id: e.g. ``orders.refund``.
            input: The arguments: a mapping, an instance of the input model,
                or JSON text exactly as a model wrote it. Text is sent as it
                is, so text that is not JSON reaches the plane, which records
                the attempt and answers INPUT_INVALID at stage ``adapter``.
            actor: The actor's JWT.
            context: Attributes for policies (``context`` in CEL).
            surface: ``direct`` (default), ``mcp`` or ``openai``.
            approval_id: Resume a suspended call with this approval.
            idempotency_key: Deduplicates repeats of the same call: a repeat
                gets the first call's recorded outcome, and the handler runs
                at most once (SPEC §8).
            timeout_ms: A time budget for the handler; the capability's
                budget applies when this one is longer.
            retry: How this call retries (the runtime's policy by default).
                Whether it retries is not configurable: see ``may_retry``.
            cancel: A token that cancels the call from any thread.

        Returns:
            An Envelope; governed failures are values, never raised.

        Raises:
            WardenError: ``timeout_ms`` is not positive, or ``idempotency_key``
                is longer than the plane takes (255 characters).
        """
        call = self._new_call(
            capability_id,
            input,
            actor=actor,
            context=context,
            surface=surface,
            approval_id=approval_id,
            idempotency_key=idempotency_key,
            timeout_ms=timeout_ms,
            retry=retry,
        )
        return await _to_the_end(self._call_in_task(call, cancel, self._loop_waits))

    def _new_call(
        self,
        capability_id: str,
        input: Mapping[str, Any] | BaseModel | str,
        *,
        actor: str | None,
        context: Mapping[str, Any] | None,
        surface: str,
        approval_id: str | None,
        idempotency_key: str | None,
        timeout_ms: int | None,
        retry: RetryPolicy | None,
    ) -> _Call:
        _check_surface(surface)
        if timeout_ms is not None and timeout_ms <= 0:
            raise WardenError("timeout_ms must be positive")
        if idempotency_key is not None and len(idempotency_key) > MAX_IDEMPOTENCY_KEY:
            raise WardenError(
                f"idempotency_key is longer than {MAX_IDEMPOTENCY_KEY} characters"
                f" ({len(idempotency_key)})"
            )
        return _Call(
            capability_id=capability_id,
            input_json=_encode_input(input),
            actor=actor or "",
            context_json=_context_json(context),
            surface=surface,
            approval_id=approval_id or "",
            idempotency_key=idempotency_key or "",
            timeout_ms=timeout_ms or 0,
            retry=retry or self.retry,
        )

    @in_invocation_trace
    async def _traced_call(self, call: _Call, cancel: CancelToken | None, waits: Waits) -> Envelope:
        return await self._call_in_task(call, cancel, waits)

    async def _call_in_task(
        self, call: _Call, cancel: CancelToken | None, waits: Waits
    ) -> Envelope:
        with cancel.bound_to_current_task() if cancel else contextlib.nullcontext():
            return await self._call(call, cancel, waits)

    async def _call(self, call: _Call, cancel: CancelToken | None, waits: Waits) -> Envelope:
        """Attempts until one answers for good, or retrying is no longer honest."""
        spec = self._capabilities.get(call.capability_id)
        side_effect = spec.side_effect if spec else None
        attempt = 1
        while True:
            if cancel is not None and cancel.cancelled:
                cancelled = CapabilityError("CANCELLED")
                return Envelope(
                    "cancelled",
                    str(uuid7()),
                    error=cancelled,
                    call_id=call.call_id,
                    attempt=attempt,
                )
            envelope = await self._attempt(call, attempt, waits)
            if (
                attempt >= call.retry.max_attempts
                or not may_retry(envelope, side_effect, call.idempotency_key)
                or call.retry.waits_too_long(envelope)
                or (call.approval_id and not _before_any_grant(envelope))
            ):
                return envelope
            assert envelope.error is not None
            delay = call.retry.delay_s(attempt, envelope)
            cause = envelope.error.cause
            log.info(
                "retrying %s (call %s) in %.0f ms after attempt %d failed with %s%s",
                call.capability_id,
                call.call_id,
                delay * 1000,
                attempt,
                envelope.error.code,
                f" ({type(cause).__name__}: {cause})" if cause is not None else "",
                extra={"warden_code": envelope.error.code, "warden_cause": cause},
            )
            try:
                await waits.sleep(delay)
            except asyncio.CancelledError:
                uncancel()
                return replace(envelope, status="cancelled", error=CapabilityError("CANCELLED"))
            attempt += 1

    async def _attempt(self, call: _Call, attempt: int, waits: Waits) -> Envelope:
        """One attempt, as an envelope stamped with its call and attempt number."""
        invocation_id = str(uuid7())
        try:
            await self._ensure_registered()
        except WardenError as exc:
            error = CapabilityError("GOVERNANCE_UNAVAILABLE", retryable=exc.transient, cause=exc)
            envelope = Envelope("failed", invocation_id, error=error)
        except asyncio.CancelledError:
            uncancel()
            envelope = Envelope("cancelled", invocation_id, error=CapabilityError("CANCELLED"))
        else:
            request = governor_pb2.BeginRequest(
                invocation_id=invocation_id,
                capability_id=call.capability_id,
                capability_version=self._versions.get(call.capability_id, ""),
                actor_token=call.actor,
                input_json=call.input_json,
                surface=call.surface,
                context_json=call.context_json,
                approval_id=call.approval_id,
                idempotency_key=call.idempotency_key,
                call_id=call.call_id,
                attempt=attempt,
                timeout_ms=call.timeout_ms,
            )
            spec = self._capabilities.get(call.capability_id)
            envelope = await self._attempts.run(spec, request, waits)
        return replace(envelope, call_id=call.call_id, attempt=attempt)

    # -- discovery ---------------------------------------------------------

    def discover(
        self,
        *,
        actor: str | None,
        surface: str = "direct",
        context: Mapping[str, Any] | None = None,
    ) -> list[DiscoveredCapability]:
        """The capabilities an actor may see on a surface; see ``adiscover``."""
        return self._sync(self.adiscover(actor=actor, surface=surface, context=context))

    async def adiscover(
        self,
        *,
        actor: str | None,
        surface: str = "direct",
        context: Mapping[str, Any] | None = None,
    ) -> list[DiscoveredCapability]:
        """The capabilities of this service an actor may see on a surface.

        Unexposed and hidden capabilities are simply absent, like unknown ones
        (SI-8). Registers this runtime's capabilities first when needed.

        Args:
            actor: The actor's JWT.
            surface: ``direct`` (default), ``mcp`` or ``openai``.
            context: Attributes for policies (``context`` in CEL).

        Raises:
            CapabilityError: UNAUTHENTICATED when the plane refused the actor's
                token (or the service's); GOVERNANCE_UNAVAILABLE when it could
                not be asked.
            WardenError: ``surface`` is none of the three.
        """
        _check_surface(surface)
        try:
            await self._ensure_registered()
        except WardenError as exc:
            raise CapabilityError(
                "GOVERNANCE_UNAVAILABLE", retryable=exc.transient, cause=exc
            ) from None
        request = registry_pb2.ListCapabilitiesRequest(
            actor_token=actor or "",
            surface=surface,
            context_json=_context_json(context),
        )
        response = await self._transport.list_capabilities(request)
        return [discovered_from_proto(c) for c in response.capabilities]

    async def agrant_keys(self) -> list[GrantKey]:
        """The async twin of ``grant_keys``."""
        return await self._transport.grant_keys()

    def grant_keys(self) -> list[GrantKey]:
        """The public keys the plane signs grants with, for ``warden.verify_grant``.

        Raises:
            WardenError: the plane could not be asked.
        """
        return self._sync(self.agrant_keys())

    async def _ensure_registered(self) -> None:
        if not self._registered and self._capabilities:
            await self.aregister()

    # -- lifecycle ---------------------------------------------------------

    def _sync(self, coroutine: Coroutine[Any, Any, T]) -> T:
        with self._loop_lock:
            if self._loop_thread is None:
                self._loop_thread = _LoopThread()
            loop_thread = self._loop_thread
        return loop_thread.run(coroutine)

    @property
    def outbox_path(self) -> Path | None:
        """The outbox file (None: reports are kept in memory only)."""
        return self._outbox.path

    def flush(self, timeout_ms: int | None = None) -> int:
        """Wait until the plane has taken every outcome report of this runtime
        (or ``timeout_ms`` has passed); returns how many still wait."""
        return self._outbox.flush(None if timeout_ms is None else timeout_ms / 1000)

    async def aflush(self, timeout_ms: int | None = None) -> int:
        """The async twin of ``flush``."""
        return await asyncio.to_thread(self.flush, timeout_ms)

    def close(self) -> None:
        """Close the connection and the handler threads, after waiting (at most
        ``governance_timeout_ms``) for the plane to take the outcome reports;
        those it has not taken stay in the outbox for the next run."""
        self._outbox.close(grace_s=self._wait_s)
        with self._loop_lock:
            loop_thread, self._loop_thread = self._loop_thread, None
        if loop_thread is not None:
            loop_thread.run(self._transport.aclose())
            loop_thread.stop()
        self._transport.close_blocking()
        self._handler_threads.shutdown()

    async def aclose(self) -> None:
        """Close the connection of the running event loop."""
        await self._transport.aclose()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_outbox(
    transport: ReportTransport, service: str, where: bool | str | os.PathLike[str]
) -> Outbox:
    if where is False:
        return Outbox(transport, None)
    if where is not True:
        return Outbox(transport, Path(where))
    try:
        return Outbox(transport, default_outbox_path(service))
    except WardenError as exc:
        log.warning("%s; outcome reports are kept in memory only", exc)
        return Outbox(transport, None)


def _before_any_grant(envelope: Envelope) -> bool:
    """Whether the attempt failed before the plane could grant it (it could
    not be asked, or a limit refused it). A resume that was granted consumed
    its approval, which no retry can present again."""
    return envelope.error is not None and envelope.error.stage == "policy"


def _context_json(context: Mapping[str, Any] | None) -> str:
    """The caller's context as JSON text, or the caller's mistake: NaN,
    infinity or a value of no JSON kind would read as a policy input nobody
    gave (written as null) or fail on the wire."""
    if not context:
        return "{}"
    try:
        # compact_json's own text (compact, keys sorted), written once.
        return json.dumps(
            dict(context),
            allow_nan=False,
            separators=(",", ":"),
            sort_keys=True,
            ensure_ascii=False,
        )
    except (TypeError, ValueError) as exc:
        raise WardenError(f"context is not JSON: {exc}") from None


def _check_surface(surface: str) -> None:
    """A surface the plane knows, or the caller's mistake (the plane would
    refuse the request, and the call would read as the plane failing)."""
    if surface not in SURFACES:
        raise WardenError(f"unknown surface {surface!r}; known: {', '.join(SURFACES)}")


def _encode_input(value: Mapping[str, Any] | BaseModel | str) -> str:
    """The input as JSON text; anything that is not JSON becomes text the plane
    rejects as INPUT_INVALID at stage ``adapter`` (and records)."""
    if isinstance(value, str):
        return _escaped_surrogates(value)
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    try:
        return _escaped_surrogates(json.dumps(value, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError):
        return ""


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escaped_surrogates(text: str) -> str:
    """``text`` as UTF-8 can carry it: a lone surrogate (which a JSON escape
    such as ``"\\ud800"`` parses to) written back as that escape, so that the
    plane answers INPUT_INVALID and records the call; the wire cannot carry
    the character itself."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
    return text
