"""The one mapping from domain errors to gRPC status."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Coroutine, Iterator
from contextvars import ContextVar
from typing import Any, NoReturn, TypeVar

import grpc

from warden_server.auth.actors import AuthenticationError
from warden_server.auth.services import ServiceAuthenticationError
from warden_server.errors import (
    Conflict,
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    RateLimited,
    RequestError,
    ResourceExhausted,
    Unauthenticated,
)
from warden_server.store import StoreError

log = logging.getLogger("warden_server.rpc")

RETRY_AFTER_METADATA = "retry-after-ms"
"""Trailing metadata of a rate-limited call: the milliseconds to wait before retrying."""
R = TypeVar("R")

_STATUS: dict[type[Exception], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    ServiceAuthenticationError: grpc.StatusCode.UNAUTHENTICATED,
    AuthenticationError: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Conflict: grpc.StatusCode.ALREADY_EXISTS,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
}


def status_of(exc: Exception) -> grpc.StatusCode:
    for kind in type(exc).__mro__:
        if kind in _STATUS:
            return _STATUS[kind]
    if isinstance(exc, RequestError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL


def rpc(method: Callable[..., R]) -> Callable[..., R]:
    """Map what a servicer method raises to a gRPC status, never leaking internals."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> R:
        try:
            return method(self, request, context)
        except Exception as exc:
            _abort_for(context, exc, method.__name__)

    return wrapper


def async_rpc(
    method: Callable[..., Coroutine[Any, Any, R]],
) -> Callable[..., Coroutine[Any, Any, R]]:
    """``rpc`` for a coroutine method run on the server's event loop."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> R:
        try:
            return await method(self, request, context)
        except Exception as exc:
            if isinstance(exc, RateLimited):
                context.set_trailing_metadata(((RETRY_AFTER_METADATA, str(exc.retry_after_ms)),))
            code, message = refusal_of(exc, method.__name__)
            _ending(code)
            await context.abort(code, message)
            raise AssertionError("unreachable: context.abort raises") from None

    return wrapper


def stream_rpc(
    method: Callable[..., Iterator[R]],
) -> Callable[..., Iterator[R]]:
    """``rpc`` for a server-streaming method: what it raises while streaming is
    mapped the same way."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[R]:
        try:
            yield from method(self, request, context)
        except Exception as exc:
            _abort_for(context, exc, method.__name__)

    return wrapper


def _abort_for(context: grpc.ServicerContext, exc: Exception, method: str) -> NoReturn:
    if isinstance(exc, RateLimited):
        context.set_trailing_metadata(((RETRY_AFTER_METADATA, str(exc.retry_after_ms)),))
    abort(context, *refusal_of(exc, method))


def refusal_of(exc: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """The status and message that answer ``exc`` raised in ``method``: a
    designed error says itself; a store failure or anything unexpected is
    logged here and answered with a generic message, never its own text."""
    if isinstance(exc, RequestError | ServiceAuthenticationError | AuthenticationError):
        return status_of(exc), str(exc)
    if isinstance(exc, StoreError):
        log.error("store unavailable in %s: %s", method, exc)
        return grpc.StatusCode.UNAVAILABLE, "the governance store is unavailable"
    log.error("unexpected error in %s", method, exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal error in the governance plane"


CALL_ENDING: ContextVar[Callable[[grpc.StatusCode], None] | None] = ContextVar(
    "warden_call_ending", default=None
)
"""Told a call's status just before ``abort`` sends it (the telemetry
interceptor's): the server sends an aborted call's status at once, and its
client may act on it before the handler has returned."""


def _ending(code: grpc.StatusCode) -> None:
    observe = CALL_ENDING.get()
    if observe is not None:
        observe(code)


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    _ending(code)
    context.abort(code, message)
    raise AssertionError("unreachable: context.abort raises")
