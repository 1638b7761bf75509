"""The gRPC server interceptor: a server span per RPC (continuing the caller's
trace from the W3C ``traceparent`` metadata), its latency and a debug log line."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final, NoReturn

import grpc
import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.trace import SpanKind

from warden_server.records.events import current_trace_id
from warden_server.services.status import CALL_ENDING
from warden_server.telemetry import Telemetry
from warden_server.telemetry.logs import fields

log = logging.getLogger("warden_server.rpc")


if TYPE_CHECKING:  # generic only in the type stubs
    Handler = grpc.RpcMethodHandler[Any, Any]
    Context = grpc.aio.ServicerContext[Any, Any]
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    Handler = grpc.RpcMethodHandler
    Context = grpc.aio.ServicerContext
    _Interceptor = grpc.aio.ServerInterceptor

_END = object()


class TelemetryInterceptor(_Interceptor):
    """Wraps Warden's unary and server-streaming RPCs; health and reflection pass through.

    A unary method is a coroutine on the server's event loop or a function
    the server runs in its thread pool; either keeps its kind. A streaming
    method (a blocking generator) runs on one thread of its own from start to
    end: the pool would resume it on any of its threads, and what a stream
    holds (its reader connection's cursor, its trace context) belongs to one.
    """

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        self._wrapped: dict[str, Handler] = {}
        """Each method's wrapped handler, built once (the caller's trace context
        is read from each call's own metadata)."""
        self._trace_fields = frozenset(propagate.get_global_textmap().fields)
        """The metadata keys the trace context is read from (``traceparent``,
        ``tracestate``, ``baggage`` unless ``OTEL_PROPAGATORS`` says otherwise)."""

    async def intercept_service(  # type: ignore[override]  # None: no such method
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        method: str = details.method.lstrip("/")
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(details)
        if handler is None or not method.startswith("warden."):
            return handler
        if handler.unary_unary is not None:
            behavior = handler.unary_unary
            wrapped = grpc.unary_unary_rpc_method_handler(
                self._coroutine(method, behavior)
                if inspect.iscoroutinefunction(behavior)
                else self._unary(method, behavior),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        elif handler.unary_stream is not None:
            wrapped = grpc.unary_stream_rpc_method_handler(
                self._streaming(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        else:
            return handler
        self._wrapped[method] = wrapped
        return wrapped

    def _unary(
        self, method: str, behavior: Callable[[Any, Any], Any]
    ) -> Callable[[Any, grpc.ServicerContext], Any]:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            with self._observed(method, context):
                return behavior(request, context)

        return wrapped

    def _coroutine(
        self, method: str, behavior: Callable[[Any, Any], Awaitable[Any]]
    ) -> Callable[[Any, Context], Awaitable[Any]]:
        async def wrapped(request: Any, context: Context) -> Any:
            with self._observed(method, context):
                return await behavior(request, context)

        return wrapped

    def _streaming(
        self, method: str, behavior: Callable[[Any, Any], Iterator[Any]]
    ) -> Callable[[Any, Context], AsyncIterator[Any]]:
        async def wrapped(request: Any, context: Context) -> AsyncIterator[Any]:
            loop = asyncio.get_running_loop()
            own = ThreadPoolExecutor(1, thread_name_prefix="warden-stream")
            with self._observed(method, context):
                trace = contextvars.copy_context()
                items = behavior(request, _BlockingContext(context, loop))

                def step() -> Any:
                    return trace.run(next, items, _END)

                try:
                    while (item := await loop.run_in_executor(own, step)) is not _END:
                        yield item
                finally:
                    # Its ``finally`` blocks run on its own thread; the loop
                    # does not wait for them.
                    own.submit(trace.run, items.close)  # type: ignore[attr-defined]
                    own.shutdown(wait=False)

        return wrapped

    def _observed(self, method: str, context: grpc.ServicerContext | Context) -> _Observed:
        """A call's span (or its caller's trace context), then its latency,
        status and debug line once it ends: when it returns or raises, or
        just before ``abort`` sends its status (``CALL_ENDING``)."""
        return _Observed(self, method, context)

    def _span(self, method: str, context: grpc.ServicerContext | Context) -> Any:
        metadata = context.invocation_metadata() or ()
        if not self._telemetry.tracing:
            # Most calls carry no trace context at all (a ``traceparent``, say):
            # the current one, empty, stays, with nothing to parse or attach.
            if not any(key in self._trace_fields for key, _ in metadata):
                return _NO_CALLER
            return _CallerContext(propagate.extract(_carrier(metadata)))
        return self._telemetry.tracer.start_as_current_span(
            method,
            context=propagate.extract(_carrier(metadata)),
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.method": method},
        )

    def _finish(self, method: str, code: str, span: Any, started: float) -> None:
        seconds = time.perf_counter() - started
        span.set_attribute("rpc.grpc.status_code", code)
        self._telemetry.metrics.rpc_seconds.series(method, code).observe(seconds)
        if not log.isEnabledFor(logging.DEBUG):
            return
        log.debug(
            "rpc %s %s",
            method,
            code,
            extra=fields(
                method=method,
                code=code,
                duration_ms=round(seconds * 1000, 3),
                trace_id=current_trace_id(),
            ),
        )


class _BlockingContext:
    """The servicer context a blocking streaming method expects, over the
    event loop's: ``abort`` raises in the calling thread once the status is
    sent, ``add_callback`` runs when the call ends."""

    def __init__(self, context: Context, loop: asyncio.AbstractEventLoop) -> None:
        self._context = context
        self._loop = loop

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        sent = asyncio.run_coroutine_threadsafe(self._context.abort(code, details), self._loop)
        sent.result()
        raise AssertionError("unreachable: context.abort raises")

    def add_callback(self, callback: Callable[[], object]) -> None:
        def ended(_: object) -> None:
            callback()

        def on_loop() -> None:
            # The stubs ask for a DoneCallback class; grpc calls any callable.
            self._context.add_done_callback(ended)  # type: ignore[arg-type]

        self._loop.call_soon_threadsafe(on_loop)

    def invocation_metadata(self) -> Any:
        return self._context.invocation_metadata()

    def set_trailing_metadata(self, metadata: Any) -> None:
        self._context.set_trailing_metadata(metadata)

    def time_remaining(self) -> float | None:
        return self._context.time_remaining()

    def peer(self) -> str:
        return self._context.peer()

    def auth_context(self) -> Any:
        return self._context.auth_context()


class _Observed:
    """``TelemetryInterceptor._observed``: a context manager of its own class,
    since a generator's costs several times as much and every call has one."""

    __slots__ = (
        "_context",
        "_ended",
        "_ending",
        "_interceptor",
        "_manager",
        "_method",
        "_span",
        "_started",
    )

    def __init__(
        self,
        interceptor: TelemetryInterceptor,
        method: str,
        context: grpc.ServicerContext | Context,
    ) -> None:
        self._interceptor = interceptor
        self._method = method
        self._context = context
        self._ended = False

    def __enter__(self) -> None:
        self._started = time.perf_counter()
        self._manager = self._interceptor._span(self._method, self._context)
        self._span = self._manager.__enter__()
        self._ending = CALL_ENDING.set(self._aborting)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, trace: object
    ) -> None:
        try:
            self._end(_code_name(self._context, exc))
        finally:
            CALL_ENDING.reset(self._ending)
            self._manager.__exit__(kind, exc, trace)

    def _aborting(self, status: grpc.StatusCode) -> None:
        self._end(status.name)

    def _end(self, code: str) -> None:
        if not self._ended:
            self._ended = True
            self._interceptor._finish(self._method, code, self._span, self._started)


def _carrier(metadata: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    return {key: value for key, value in metadata if isinstance(value, str)}


class _NoCaller:
    """A call with no trace context: nothing to make current."""

    __slots__ = ()

    def __enter__(self) -> _NoCaller:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def set_attribute(self, key: str, value: object) -> None:
        """Spans' attributes go nowhere while nothing exports them."""


_NO_CALLER: Final = _NoCaller()


class _CallerContext:
    """The caller's trace context made current, with no span of our own: what
    a request records its trace id from while spans go nowhere."""

    __slots__ = ("_context", "_token")

    def __init__(self, context: otel_context.Context) -> None:
        self._context = context
        self._token: object = None

    def __enter__(self) -> _CallerContext:
        self._token = otel_context.attach(self._context)
        return self

    def __exit__(self, *exc: object) -> None:
        otel_context.detach(self._token)  # type: ignore[arg-type]

    def set_attribute(self, key: str, value: object) -> None:
        """Spans' attributes go nowhere while nothing exports them."""


def _code_name(context: Any, ended: BaseException | None) -> str:
    """The status a call ended with, when ``abort`` did not say: what the
    loop's context knows, else OK, or what ended the call."""
    code = context.code() if hasattr(context, "code") else None
    if code is not None:
        return code.name if isinstance(code, grpc.StatusCode) else str(code)
    if ended is None:
        return "OK"
    return "CANCELLED" if isinstance(ended, asyncio.CancelledError) else "UNKNOWN"
