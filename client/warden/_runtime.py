"""The Runtime: register capabilities, and invoke them under governance.

``invoke`` asks the plane for the pre-execution stages (``Begin``), runs the
handler locally within its time budget, classifies what it raised, validates
its output and reports the outcome (``Complete``). Governed failures come back
as envelopes, never as exceptions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import json
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from warden._capability import CapabilitySpec, ErrorSpec, SideEffect, build_spec
from warden._context import Actor, Context, DeclaredErrors
from warden._envelope import Envelope, Status
from warden._errors import CapabilityError, WardenError
from warden._tracing import in_invocation_trace
from warden._transport import Transport
from warden.shared.canonical import compact_json
from warden.shared.schema import redact, validation_issues
from warden.v1 import errors_pb2, governor_pb2, registry_pb2

log = logging.getLogger("warden")
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class OutputInvalidError(Exception):
    """The handler's output broke its schema (a private cause: never shown to models)."""


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
        and so its current trace span), and wait for the result."""
        caller = contextvars.copy_context()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def start() -> None:
            task = self.loop.create_task(coroutine, context=caller)
            task.add_done_callback(functools.partial(_settle, done))

        self.loop.call_soon_threadsafe(start)
        return done.result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


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
    """

    def __init__(
        self,
        target: str,
        *,
        service: str,
        token: str,
        governance_timeout_ms: int = 5_000,
        max_handler_threads: int = 32,
    ) -> None:
        self.target = target
        self.service = service
        self._transport = Transport(target, token, timeout_s=governance_timeout_ms / 1000)
        self._capabilities: dict[str, CapabilitySpec] = {}
        self._versions: dict[str, str] = {}
        self._registered = False
        self._register_lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_handler_threads, thread_name_prefix="warden-handler"
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
    ) -> Callable[[F], F]:
        """Declare a capability served by the decorated handler.

        The handler receives the validated input model and a ``Context`` and
        returns the output model. ``side_effect`` defaults to ``write``, the
        assumption that never retries on its own; ``exposure`` defaults to
        every surface; ``description`` to the handler's docstring.
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
            )
            self._registered = False
            return handler

        return decorate

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
        request = registry_pb2.RegisterRequest(
            capabilities=[spec.to_proto() for spec in self._capabilities.values()]
        )
        response = await self._transport.register(request)
        registered = [
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
        input: Mapping[str, Any] | BaseModel,
        *,
        actor: str | None,
        context: Mapping[str, Any] | None = None,
        surface: str = "direct",
        approval_id: str | None = None,
        idempotency_key: str | None = None,
        timeout_ms: int | None = None,
    ) -> Envelope:
        """Invoke a capability for an actor; see ``ainvoke``."""
        return self._sync(
            self.ainvoke(
                capability_id,
                input,
                actor=actor,
                context=context,
                surface=surface,
                approval_id=approval_id,
                idempotency_key=idempotency_key,
                timeout_ms=timeout_ms,
            )
        )

    @in_invocation_trace
    async def ainvoke(
        self,
        capability_id: str,
        input: Mapping[str, Any] | BaseModel,
        *,
        actor: str | None,
        context: Mapping[str, Any] | None = None,
        surface: str = "direct",
        approval_id: str | None = None,
        idempotency_key: str | None = None,
        timeout_ms: int | None = None,
    ) -> Envelope:
        """Invoke a capability for an actor under governance.

        Args:
            capability_id: e.g. ``orders.refund``.
            input: The arguments (a mapping, or an instance of the input model).
            actor: The actor's JWT.
            context: Attributes for policies (``context`` in CEL).
            surface: ``direct`` (default), ``mcp`` or ``openai``.
            approval_id: Resume a suspended call with this approval.
            idempotency_key: Deduplicates repeats of the same call.
            timeout_ms: A time budget below the capability's.

        Returns:
            An Envelope; governed failures are values, never raised.
        """
        invocation_id = str(uuid.uuid4())
        try:
            await self._ensure_registered()
        except WardenError as exc:
            error = CapabilityError("GOVERNANCE_UNAVAILABLE", retryable=exc.transient, cause=exc)
            return Envelope("failed", invocation_id, error=error)
        spec = self._capabilities.get(capability_id)
        request = governor_pb2.BeginRequest(
            invocation_id=invocation_id,
            capability_id=capability_id,
            capability_version=self._versions.get(capability_id, ""),
            actor_token=actor or "",
            input_json=_encode_input(input),
            surface=surface,
            context_json=compact_json(dict(context or {})),
            approval_id=approval_id or "",
            idempotency_key=idempotency_key or "",
        )
        try:
            response = await self._transport.begin(request)
        except CapabilityError as error:
            return Envelope("failed", invocation_id, error=error)
        outcome = response.WhichOneof("outcome")
        if outcome == "failure":
            return Envelope("failed", invocation_id, error=_error_from_proto(response.failure))
        if outcome == "suspension":
            suspension = response.suspension
            return Envelope(
                "suspended",
                invocation_id,
                error=_error_from_proto(suspension.failure),
                approval_id=suspension.approval_id,
            )
        if spec is None:
            # Granted for a capability this runtime serves no handler for.
            return await self._report(
                invocation_id,
                response.grant.token,
                None,
                CapabilityError(
                    "INTERNAL_ERROR", cause=WardenError(f"no handler for {capability_id} here")
                ),
                executed=False,
                started=time.monotonic(),
            )
        return await self._execute(spec, invocation_id, response.grant, timeout_ms)

    async def _execute(
        self,
        spec: CapabilitySpec,
        invocation_id: str,
        grant: governor_pb2.Grant,
        timeout_ms: int | None,
    ) -> Envelope:
        started = time.monotonic()
        attrs = json.loads(grant.actor.attrs_json) if grant.actor.attrs_json else {}
        ctx = Context(
            actor=Actor(
                id=grant.actor.id,
                roles=tuple(grant.actor.roles),
                tenant=grant.actor.tenant,
                attrs=attrs,
            ),
            invocation_id=invocation_id,
            errors=DeclaredErrors(spec.errors),
        )
        try:
            model = spec.input_model.model_validate_json(grant.input_json)
        except ValidationError as exc:
            error = CapabilityError(
                "INPUT_INVALID", details={"issues": _pydantic_issues(exc)}, cause=exc
            )
            return await self._report(
                invocation_id, grant.token, spec, error, executed=False, started=started
            )
        budget_ms = (
            min(filter(None, (timeout_ms, grant.timeout_ms)))
            if (timeout_ms or grant.timeout_ms)
            else None
        )
        ran = threading.Event()
        try:
            result = await asyncio.wait_for(
                self._run(spec, model, ctx, ran), budget_ms / 1000 if budget_ms else None
            )
        except TimeoutError as exc:
            error = CapabilityError("TIMEOUT", cause=exc)
            return await self._report(
                invocation_id, grant.token, spec, error, executed=ran.is_set(), started=started
            )
        except asyncio.CancelledError:
            # The caller cancelled while the handler ran: the answer is an envelope
            # with status cancelled, reported like every other outcome.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            error = CapabilityError("CANCELLED")
            return await asyncio.shield(
                self._report(
                    invocation_id, grant.token, spec, error, executed=ran.is_set(), started=started
                )
            )
        except CapabilityError as raised:
            declared = spec.errors.get(raised.code)
            if declared is not None and raised.expose_to_model:
                return await self._report(
                    invocation_id, grant.token, spec, raised, executed=False, started=started
                )
            error = CapabilityError("INTERNAL_ERROR", cause=raised)
            return await self._report(
                invocation_id, grant.token, spec, error, executed=True, started=started
            )
        except Exception as exc:
            error = CapabilityError("INTERNAL_ERROR", cause=exc)
            return await self._report(
                invocation_id, grant.token, spec, error, executed=True, started=started
            )
        try:
            output_json, output = _checked_output(spec, result)
        except OutputInvalidError as exc:
            error = CapabilityError("OUTPUT_INVALID", cause=exc)
            return await self._report(
                invocation_id, grant.token, spec, error, executed=True, started=started
            )
        return await self._report(
            invocation_id,
            grant.token,
            spec,
            None,
            executed=True,
            started=started,
            output_json=output_json,
            output=output,
        )

    async def _run(
        self, spec: CapabilitySpec, model: BaseModel, ctx: Context, ran: threading.Event
    ) -> Any:
        if spec.is_async:
            ran.set()
            return await spec.handler(model, ctx)

        def call() -> Any:
            ran.set()
            return spec.handler(model, ctx)

        loop = asyncio.get_running_loop()
        copy = contextvars.copy_context()
        return await loop.run_in_executor(self._executor, functools.partial(copy.run, call))

    async def _report(
        self,
        invocation_id: str,
        grant_token: str,
        spec: CapabilitySpec | None,
        error: CapabilityError | None,
        *,
        executed: bool,
        started: float,
        output_json: Any = None,
        output: Any = None,
    ) -> Envelope:
        """Step 14: report the outcome, then answer with the envelope."""
        duration_ms = int((time.monotonic() - started) * 1000)
        request = governor_pb2.CompleteRequest(
            invocation_id=invocation_id,
            grant_token=grant_token,
            executed_before_failure=executed and error is not None,
            duration_ms=duration_ms,
        )
        if error is None:
            request.status = governor_pb2.OUTCOME_STATUS_SUCCEEDED
            if spec is not None:
                request.output_json = compact_json(redact(output_json, spec.output_schema))
        else:
            cancelled = error.code == "CANCELLED"
            request.status = (
                governor_pb2.OUTCOME_STATUS_CANCELLED
                if cancelled
                else governor_pb2.OUTCOME_STATUS_FAILED
            )
            request.failure.CopyFrom(_error_to_proto(error))
            request.diagnostics.CopyFrom(_diagnostics(error.cause))
        try:
            await self._transport.complete(request)
        except CapabilityError as report_error:
            log.error(
                "the outcome of invocation %s could not be reported: %s",
                invocation_id,
                report_error.cause,
            )
        if error is None:
            return Envelope("succeeded", invocation_id, output=output)
        status: Status = "cancelled" if error.code == "CANCELLED" else "failed"
        return Envelope(
            status,
            invocation_id,
            error=error,
            executed_before_failure=request.executed_before_failure,
        )

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

    def close(self) -> None:
        """Close the connection and the handler threads."""
        with self._loop_lock:
            loop_thread, self._loop_thread = self._loop_thread, None
        if loop_thread is not None:
            loop_thread.run(self._transport.aclose())
            loop_thread.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def aclose(self) -> None:
        """Close the connection of the running event loop."""
        await self._transport.aclose()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _encode_input(value: Mapping[str, Any] | BaseModel) -> str:
    """The input as JSON text; anything that is not JSON becomes text the plane
    rejects as INPUT_INVALID at stage ``adapter`` (and records)."""
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return ""


def _checked_output(spec: CapabilitySpec, result: Any) -> tuple[Any, BaseModel]:
    if isinstance(result, BaseModel):
        if not isinstance(result, spec.output_model):
            raise OutputInvalidError(
                f"handler returned {type(result).__name__}, not {spec.output_model.__name__}"
            )
        value = result.model_dump(mode="json")
    else:
        value = result
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise OutputInvalidError(f"output is not JSON: {type(exc).__name__}") from None
    issues = validation_issues(spec.output_validator, value)
    if issues:
        raise OutputInvalidError(
            "output does not match its schema: "
            + "; ".join(f"{i.path or '/'} {i.message}" for i in issues)
        )
    try:
        return value, spec.output_model.model_validate(value)
    except ValidationError as exc:
        raise OutputInvalidError(
            f"output does not match its model: {exc.error_count()} errors"
        ) from None


def _pydantic_issues(exc: ValidationError) -> list[dict[str, str]]:
    return sorted(
        (
            {"path": "".join(f"/{p}" for p in e["loc"]), "message": e["msg"]}
            for e in exc.errors(include_input=False, include_url=False)
        ),
        key=lambda i: (i["path"], i["message"]),
    )


def _error_from_proto(failure: errors_pb2.Failure) -> CapabilityError:
    details = json.loads(failure.details_json) if failure.details_json else None
    return CapabilityError(
        failure.code,
        failure.public_message,
        stage=failure.stage,
        retryable=failure.retryable,
        expose_to_model=failure.exposed,
        details=details,
    )


def _error_to_proto(error: CapabilityError) -> errors_pb2.Failure:
    return errors_pb2.Failure(
        code=error.code,
        stage=error.stage,
        public_message=error.public_message,
        retryable=error.retryable,
        exposed=error.expose_to_model,
        details_json=compact_json(error.details) if error.details else "",
    )


def _diagnostics(cause: BaseException | None) -> governor_pb2.Diagnostics:
    if cause is None:
        return governor_pb2.Diagnostics()
    stack = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    return governor_pb2.Diagnostics(
        cause_type=f"{type(cause).__module__}.{type(cause).__qualname__}",
        cause_message=str(cause),
        stack=stack,
    )
