"""One attempt of a call: ``Begin``, then the replay it answers with, or the
handler within its time budget, its output checked, and its outcome handed to
the outbox, which reports it (``Complete``) while the caller goes on.

An attempt never raises for a governed failure and answers cancellation with
a ``cancelled`` envelope. Sensitive values (SI-5) are scrubbed here out of
everything that leaves the service besides the input and output themselves:
the diagnostics of a failure, and the details a declared error carries.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from warden._capability import CapabilitySpec
from warden._context import Actor, Authorizer, Context, DeclaredErrors
from warden._envelope import Envelope, Status
from warden._errors import CapabilityError, WardenError
from warden._handlers import HandlerThreads
from warden._outbox import IdempotencyScope, Outbox
from warden._transport import Transport
from warden.shared.canonical import canonical_json, compact_json, strict_loads
from warden.shared.redaction import scrub_json, scrub_text, unechoed, value_texts
from warden.shared.schema import validation_issues
from warden.v1 import errors_pb2, governor_pb2

T = TypeVar("T")

_STATUSES: dict[int, Status] = {
    governor_pb2.OUTCOME_STATUS_SUCCEEDED: "succeeded",
    governor_pb2.OUTCOME_STATUS_FAILED: "failed",
    governor_pb2.OUTCOME_STATUS_CANCELLED: "cancelled",
}


class OutputInvalidError(Exception):
    """The handler's output broke its schema (a private cause: never shown to models)."""


@dataclass(slots=True)
class _Granted:
    """What one granted attempt knows while it runs."""

    invocation_id: str
    token: str
    spec: CapabilitySpec | None
    scope: IdempotencyScope | None
    """The capability and idempotency key of the call, when it has a key."""
    started: float = field(default_factory=time.monotonic)
    secrets: frozenset[str] = frozenset()
    """The text of every sensitive value in the input (and output, once known)."""


class BeginCancelled(Exception):
    """The attempt was cancelled while its ``Begin`` was on its way; the call
    goes on (``begin``), and its grant, if it brings one, must be closed out."""

    def __init__(self, begin: asyncio.Future[governor_pb2.BeginResponse]) -> None:
        super().__init__("cancelled during Begin")
        self.begin = begin


class Waits(Protocol):
    """How an attempt waits for the plane, the outbox and the handler.

    An attempt is one coroutine whichever way it waits. ``LoopWaits`` waits on
    the runtime's event loop; ``BlockingWaits`` blocks the caller's thread, and
    since none of its waits suspends the coroutine, the attempt runs to its end
    in one step on that thread (``run_to_end``), with no event loop and no
    switch between threads but the handler's.
    """

    async def reported(self, scope: IdempotencyScope) -> None:
        """Until the plane has taken the report of this runtime's last call with ``scope``."""

    async def room(self) -> bool:
        """Whether the outbox has room for one more report (after waiting a while)."""

    async def begin(self, request: governor_pb2.BeginRequest) -> governor_pb2.BeginResponse:
        """The plane's answer. Raises CapabilityError (the plane could not
        answer) or BeginCancelled."""

    async def handler(self, call: Callable[[], Any], budget_s: float | None) -> Any:
        """What ``call`` returns, run on a handler thread. Raises TimeoutError
        when ``budget_s`` passes first, and whatever ``call`` raises."""

    async def resolved(self, verdict: Awaitable[Any]) -> Any:
        """What an authorizer's awaitable verdict comes to."""

    async def sleep(self, seconds: float) -> None:
        """A pause between attempts."""


class LoopWaits:
    """Waits on the running event loop (``ainvoke``, and ``invoke`` on the
    runtime's own loop)."""

    def __init__(
        self, transport: Transport, outbox: Outbox, handler_threads: HandlerThreads, wait_s: float
    ) -> None:
        self._transport = transport
        self._outbox = outbox
        self._handler_threads = handler_threads
        self._wait_s = wait_s

    async def reported(self, scope: IdempotencyScope) -> None:
        await self._outbox.reported(scope, self._wait_s)

    async def room(self) -> bool:
        return await self._outbox.room(self._wait_s)

    async def begin(self, request: governor_pb2.BeginRequest) -> governor_pb2.BeginResponse:
        begin = asyncio.ensure_future(self._transport.begin(request))
        try:
            return await asyncio.shield(begin)
        except asyncio.CancelledError:
            uncancel()
            raise BeginCancelled(begin) from None

    async def handler(self, call: Callable[[], Any], budget_s: float | None) -> Any:
        async with asyncio.timeout(budget_s):
            return await self._handler_threads.run(call)

    async def resolved(self, verdict: Awaitable[Any]) -> Any:
        return await verdict

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class BlockingWaits:
    """Waits by blocking the caller's thread (``invoke`` of a synchronous
    handler): ``Begin`` through a blocking connection, the handler's result
    on a future of the caller's own. Only an awaitable an authorizer returns
    goes to the runtime's event loop (``on_loop``)."""

    def __init__(
        self,
        transport: Transport,
        outbox: Outbox,
        handler_threads: HandlerThreads,
        wait_s: float,
        on_loop: Callable[[Coroutine[Any, Any, Any]], Any],
    ) -> None:
        self._transport = transport
        self._outbox = outbox
        self._handler_threads = handler_threads
        self._wait_s = wait_s
        self._on_loop = on_loop

    async def reported(self, scope: IdempotencyScope) -> None:
        self._outbox.reported_blocking(scope, self._wait_s)

    async def room(self) -> bool:
        return self._outbox.room_blocking(self._wait_s)

    async def begin(self, request: governor_pb2.BeginRequest) -> governor_pb2.BeginResponse:
        return self._transport.begin_blocking(request)

    async def handler(self, call: Callable[[], Any], budget_s: float | None) -> Any:
        return self._handler_threads.call(call, budget_s)

    async def resolved(self, verdict: Awaitable[Any]) -> Any:
        return self._on_loop(_awaited(verdict))

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


async def _awaited(verdict: Awaitable[T]) -> T:
    return await verdict


def run_to_end(attempt: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (one that waits with
    ``BlockingWaits``) to its end, on this thread."""
    try:
        step = attempt.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    attempt.close()
    raise RuntimeError(f"an attempt that blocks suspended on {step!r}")


class AttemptRunner:
    """Runs attempts against one plane: ``Begin``, the handler, the report,
    each waited for as the attempt's ``Waits`` say."""

    def __init__(self, outbox: Outbox, authorizers: Sequence[Authorizer] = ()) -> None:
        self._authorizers = authorizers
        self._outbox = outbox

    async def run(
        self, spec: CapabilitySpec | None, request: governor_pb2.BeginRequest, waits: Waits
    ) -> Envelope:
        """One attempt of ``spec`` (None: a capability this runtime does not serve)."""
        invocation_id = request.invocation_id
        scope = (
            (request.capability_id, request.idempotency_key) if request.idempotency_key else None
        )
        if scope is not None:
            # A repeat of a key this runtime just used is answered with that call's
            # outcome (replayed) once the plane has it, not OPERATION_IN_PROGRESS.
            await waits.reported(scope)
        if not await waits.room():
            # The plane takes outcome reports slower than calls end: fail closed
            # before the handler, rather than pile up reports without end.
            cause = WardenError(
                f"{self._outbox.backlog} outcome reports wait for the plane "
                f"(at most {self._outbox.backlog_limit} are held)"
            )
            error = CapabilityError("GOVERNANCE_UNAVAILABLE", retryable=True, cause=cause)
            return Envelope("failed", invocation_id, error=error)
        try:
            response = await waits.begin(request)
        except BeginCancelled as cancelled:
            return await self._cancelled_during_begin(spec, invocation_id, scope, cancelled.begin)
        except CapabilityError as error:
            return Envelope("failed", invocation_id, error=error)
        outcome = response.WhichOneof("outcome")
        if outcome == "failure":
            return Envelope("failed", invocation_id, error=error_from_proto(response.failure))
        if outcome == "suspension":
            suspension = response.suspension
            return Envelope(
                "suspended",
                invocation_id,
                error=error_from_proto(suspension.failure),
                approval_id=suspension.approval_id,
            )
        if outcome == "replay":
            return _replayed(spec, invocation_id, response.replay)
        granted = _Granted(invocation_id, response.grant.token, spec, scope)
        if spec is None:
            cause = WardenError(f"no handler for {request.capability_id} here")
            return self._report(granted, CapabilityError("INTERNAL_ERROR", cause=cause))
        return await self._execute(granted, spec, response.grant, waits)

    async def _cancelled_during_begin(
        self,
        spec: CapabilitySpec | None,
        invocation_id: str,
        scope: IdempotencyScope | None,
        begin: asyncio.Future[governor_pb2.BeginResponse],
    ) -> Envelope:
        # The plane may grant all the same. Wait for its answer and close a
        # grant out as cancelled, so that it is audited and an idempotency key
        # it reserved is released rather than left running.
        cancelled = CapabilityError("CANCELLED")
        try:
            response = await begin
        except CapabilityError:
            return Envelope("cancelled", invocation_id, error=cancelled)
        if response.WhichOneof("outcome") == "grant":
            granted = _Granted(invocation_id, response.grant.token, spec, scope)
            return self._report(granted, cancelled)
        return Envelope("cancelled", invocation_id, error=cancelled)

    async def _execute(
        self, granted: _Granted, spec: CapabilitySpec, grant: governor_pb2.Grant, waits: Waits
    ) -> Envelope:
        attrs = json.loads(grant.actor.attrs_json) if grant.actor.attrs_json else {}
        ctx = Context(
            actor=Actor(
                id=grant.actor.id,
                roles=tuple(grant.actor.roles),
                tenant=grant.actor.tenant,
                attrs=attrs,
            ),
            invocation_id=granted.invocation_id,
            errors=DeclaredErrors(spec.errors),
            grant_token=grant.token,
            capability_id=spec.id,
        )
        try:
            granted.secrets = spec.input_secrets(grant.input_json)
            model = spec.input_model.model_validate_json(grant.input_json)
        except (ValidationError, ValueError) as exc:
            issues = (
                _pydantic_issues(exc, grant.input_json) if isinstance(exc, ValidationError) else []
            )
            error = CapabilityError("INPUT_INVALID", details={"issues": issues}, cause=exc)
            return self._report(granted, error)
        refusal = await self._authorize(spec, model, ctx, waits)
        if refusal is not None:
            return self._report(granted, refusal)
        # The plane granted the budget that applies: the capability's, or the
        # caller's when that is shorter.
        budget_s = grant.timeout_ms / 1000 if grant.timeout_ms else None
        ran = threading.Event()
        try:
            result = await self._run(spec, model, ctx, ran, budget_s, waits)
        except TimeoutError as exc:
            error = CapabilityError("TIMEOUT", cause=exc)
            return self._report(granted, error, executed=ran.is_set())
        except asyncio.CancelledError:
            # The caller cancelled while the handler ran: the answer is an envelope
            # with status cancelled, reported like every other outcome.
            uncancel()
            error = CapabilityError("CANCELLED")
            return self._report(granted, error, executed=ran.is_set())
        except CapabilityError as raised:
            declared = spec.errors.get(raised.code)
            if declared is not None and raised.expose_to_model and _recordable(raised.details):
                return self._report(granted, raised)
            # Undeclared, or details the audit log cannot hold: concealed.
            error = CapabilityError("INTERNAL_ERROR", cause=raised)
            return self._report(granted, error, executed=True)
        except Exception as exc:
            error = CapabilityError("INTERNAL_ERROR", cause=exc)
            return self._report(granted, error, executed=True)
        except BaseException:
            # Interrupted (KeyboardInterrupt in the thread of a blocking invoke):
            # the outcome is on its way to the plane before the interruption goes on.
            self._report(granted, CapabilityError("CANCELLED"), executed=ran.is_set())
            raise
        try:
            output_json, output = _checked_output(spec, result, granted)
        except OutputInvalidError as exc:
            error = CapabilityError("OUTPUT_INVALID", cause=exc)
            return self._report(granted, error, executed=True)
        return self._report(granted, None, output_json=output_json, output=output)

    async def _authorize(
        self, spec: CapabilitySpec, model: BaseModel, ctx: Context, waits: Waits
    ) -> CapabilityError | None:
        """Step 6 on the service's side: app middleware, failing closed."""
        checks = [*self._authorizers, *([spec.authorize] if spec.authorize else [])]
        for check in checks:
            try:
                verdict = check(model, ctx)
                if inspect.isawaitable(verdict):
                    verdict = await waits.resolved(verdict)
            except CapabilityError as raised:
                if raised.code == "FORBIDDEN":
                    return raised
                return CapabilityError("INTERNAL_ERROR", stage="authorization", cause=raised)
            except Exception as exc:
                return CapabilityError("INTERNAL_ERROR", stage="authorization", cause=exc)
            if verdict is not True:
                name = getattr(check, "__qualname__", repr(check))
                return CapabilityError(
                    "FORBIDDEN", cause=PermissionError(f"refused by authorizer {name}")
                )
        return None

    async def _run(
        self,
        spec: CapabilitySpec,
        model: BaseModel,
        ctx: Context,
        ran: threading.Event,
        budget_s: float | None,
        waits: Waits,
    ) -> Any:
        if spec.is_async:
            ran.set()
            async with asyncio.timeout(budget_s):
                return await spec.handler(model, ctx)

        def call() -> Any:
            ran.set()
            return spec.handler(model, ctx)

        copy = contextvars.copy_context()
        return await waits.handler(functools.partial(copy.run, call), budget_s)

    def _report(
        self,
        granted: _Granted,
        error: CapabilityError | None,
        *,
        executed: bool = False,
        output_json: Any = None,
        output: Any = None,
    ) -> Envelope:
        """Step 14: hand the outcome to the outbox, then answer with the envelope."""
        request = governor_pb2.CompleteRequest(
            invocation_id=granted.invocation_id,
            grant_token=granted.token,
            executed_before_failure=executed and error is not None,
            duration_ms=int((time.monotonic() - granted.started) * 1000),
        )
        if error is None:
            # In clear: the plane redacts what it stores, and seals what it keeps for replay.
            request.status = governor_pb2.OUTCOME_STATUS_SUCCEEDED
            request.output_json = compact_json(output_json)
        else:
            if error.details and granted.secrets:
                error.details = scrub_json(error.details, granted.secrets)
            cancelled = error.code == "CANCELLED"
            request.status = (
                governor_pb2.OUTCOME_STATUS_CANCELLED
                if cancelled
                else governor_pb2.OUTCOME_STATUS_FAILED
            )
            request.failure.CopyFrom(error_to_proto(error))
            request.diagnostics.CopyFrom(_diagnostics(error.cause, granted.secrets))
        self._outbox.submit(request, granted.scope)
        return _answer(granted, error, request.executed_before_failure, output_json, output)


def _answer(
    granted: _Granted,
    error: CapabilityError | None,
    executed_before_failure: bool,
    output_json: Any,
    output: Any,
) -> Envelope:
    """The envelope for a reported outcome."""
    spec = granted.spec
    if error is None:
        model_output = spec.model_output(output_json) if spec else None
        return Envelope(
            "succeeded", granted.invocation_id, output=output, model_output=model_output
        )
    status: Status = "cancelled" if error.code == "CANCELLED" else "failed"
    return Envelope(
        status,
        granted.invocation_id,
        error=error,
        executed_before_failure=executed_before_failure,
    )


def _replayed(
    spec: CapabilitySpec | None, invocation_id: str, replay: governor_pb2.Replay
) -> Envelope:
    """The recorded outcome of the call that holds the idempotency key."""
    status = _STATUSES.get(replay.status, "failed")
    original = replay.original_invocation_id
    if status != "succeeded":
        return Envelope(
            status,
            invocation_id,
            error=error_from_proto(replay.failure),
            executed_before_failure=replay.executed_before_failure,
            replayed_from=original,
        )
    value = json.loads(replay.output_json)
    if spec is None:
        return Envelope("succeeded", invocation_id, output=value, replayed_from=original)
    try:
        output = spec.output_model.model_validate(value)
    except ValidationError as exc:
        # Recorded under an earlier version whose output no longer fits the model.
        error = CapabilityError("OUTPUT_INVALID", cause=exc)
        return Envelope(
            "failed",
            invocation_id,
            error=error,
            executed_before_failure=True,
            replayed_from=original,
        )
    return Envelope(
        "succeeded",
        invocation_id,
        output=output,
        model_output=spec.model_output(value),
        replayed_from=original,
    )


def uncancel() -> None:
    """Take back a cancellation the current task has handled (answered with an envelope)."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _checked_output(spec: CapabilitySpec, result: Any, granted: _Granted) -> tuple[Any, BaseModel]:
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
    granted.secrets |= spec.output_secrets(value)
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


def _recordable(details: Any) -> bool:
    """Whether the plane records a declared error's details as they are: a
    JSON object as every reader takes it (no NaN or infinity, nothing but
    JSON's own kinds, integers within ±2^53, valid Unicode, nested at most
    64 deep) of at most ``MAX_DETAILS_BYTES``. A model must not be shown
    what the audit log cannot hold: the plane would refuse the report."""
    if details is None:
        return True
    try:
        text = json.dumps(details, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        strict_loads(text)
        canonical_json(details)
    except (TypeError, ValueError, RecursionError):
        return False
    return isinstance(details, dict) and len(text.encode()) <= MAX_DETAILS_BYTES


MAX_DETAILS_BYTES: Final = 64 * 1024
"""The largest declared error details a plane records by default
(``[limits] max_context_bytes``)."""


_VALIDATOR_PREFIXES = ("Value error, ", "Assertion failed, ")
"""What pydantic puts before a validator's own text: not the model's business."""


def _pydantic_issues(exc: ValidationError, input_json: str) -> list[dict[str, str]]:
    """The model's issues: each path, and its message unless that repeats a
    value of the input (the full text stays in the error's private cause)."""
    echoes = value_texts(json.loads(input_json))
    issues = []
    for e in exc.errors(include_input=False, include_url=False):
        message = e["msg"]
        for prefix in _VALIDATOR_PREFIXES:
            message = message.removeprefix(prefix)
        path = "".join(f"/{p}" for p in e["loc"])
        issues.append({"path": path, "message": unechoed(message, echoes)})
    return sorted(issues, key=lambda i: (i["path"], i["message"]))


def error_from_proto(failure: errors_pb2.Failure) -> CapabilityError:
    details = json.loads(failure.details_json) if failure.details_json else None
    return CapabilityError(
        failure.code,
        failure.public_message,
        stage=failure.stage,
        retryable=failure.retryable,
        expose_to_model=failure.exposed,
        details=details,
    )


def error_to_proto(error: CapabilityError) -> errors_pb2.Failure:
    return errors_pb2.Failure(
        code=error.code,
        stage=error.stage,
        public_message=error.public_message,
        retryable=error.retryable,
        exposed=error.expose_to_model,
        details_json=compact_json(error.details) if error.details else "",
    )


def _diagnostics(cause: BaseException | None, secrets: frozenset[str]) -> governor_pb2.Diagnostics:
    """The private body of a failure, with every sensitive value masked: an
    exception message is a classic way for a card number to reach a log."""
    if cause is None:
        return governor_pb2.Diagnostics()
    stack = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    return governor_pb2.Diagnostics(
        cause_type=f"{type(cause).__module__}.{type(cause).__qualname__}",
        cause_message=scrub_text(str(cause), secrets),
        stack=scrub_text(stack, secrets),
    )
