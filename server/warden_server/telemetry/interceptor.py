"""The gRPC server interceptor: a server span per RPC (continuing the caller's
trace from the W3C ``traceparent`` metadata), its latency and a debug log line."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.trace import SpanKind

from warden_server.records.events import current_trace_id
from warden_server.telemetry import Telemetry
from warden_server.telemetry.logs import fields

log = logging.getLogger("warden_server.rpc")


if TYPE_CHECKING:  # generic only in the type stubs
    Handler = grpc.RpcMethodHandler[Any, Any]
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor


class TelemetryInterceptor(_Interceptor):
    """Wraps Warden's unary and server-streaming RPCs; health and reflection pass through."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        self._wrapped: dict[str, Handler] = {}
        """Each method's wrapped handler, built once (the caller's trace context
        is read from each call's own metadata)."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        method: str = details.method.lstrip("/")
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = continuation(details)
        if handler is None or not method.startswith("warden."):
            return handler
        if handler.unary_unary is not None:
            wrapped = grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary),
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
            started = time.perf_counter()
            with self._span(method, context) as span:
                try:
                    return behavior(request, context)
                finally:
                    self._finish(method, context, span, started)

        return wrapped

    def _streaming(
        self, method: str, behavior: Callable[[Any, Any], Iterator[Any]]
    ) -> Callable[[Any, grpc.ServicerContext], Iterator[Any]]:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            started = time.perf_counter()
            with self._span(method, context) as span:
                try:
                    yield from behavior(request, context)
                finally:
                    self._finish(method, context, span, started)

        return wrapped

    def _span(self, method: str, context: grpc.ServicerContext) -> Any:
        carrier = {
            key: value for key, value in context.invocation_metadata() if isinstance(value, str)
        }
        if not self._telemetry.tracing:
            return _CallerContext(propagate.extract(carrier))
        return self._telemetry.tracer.start_as_current_span(
            method,
            context=propagate.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.method": method},
        )

    def _finish(
        self, method: str, context: grpc.ServicerContext, span: Any, started: float
    ) -> None:
        seconds = time.perf_counter() - started
        code = _code_name(context)
        span.set_attribute("rpc.grpc.status_code", code)
        self._telemetry.metrics.rpc_series(method, code).observe(seconds)
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


def _code_name(context: grpc.ServicerContext) -> str:
    code = context.code()  # type: ignore[attr-defined]  # grpcio has it; the stubs lack it
    if code is None:
        return "OK"
    return code.name if isinstance(code, grpc.StatusCode) else str(code)
