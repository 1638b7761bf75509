"""Trace context for the plane: every invocation belongs to one trace.

The plane stores the trace id in each audit record, so an invocation's
decision and outcome records, and the caller's own spans, can be joined. When
the caller is inside a span, the invocation joins its trace; otherwise it
gets a trace of its own, so Begin and Complete still share one.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from opentelemetry import context, propagate, trace

P = ParamSpec("P")
T = TypeVar("T")


@contextmanager
def invocation_trace() -> Iterator[None]:
    """Within: a valid span context (the caller's, or a fresh one)."""
    if trace.get_current_span().get_span_context().is_valid:
        yield
        return
    fresh = trace.SpanContext(
        trace_id=secrets.randbits(128) or 1,
        span_id=secrets.randbits(64) or 1,
        is_remote=False,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(fresh)))
    try:
        yield
    finally:
        context.detach(token)


def in_invocation_trace(
    method: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Run a coroutine function inside ``invocation_trace``."""

    @functools.wraps(method)
    async def traced(*args: P.args, **kwargs: P.kwargs) -> T:
        with invocation_trace():
            return await method(*args, **kwargs)

    return traced


def trace_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context as gRPC metadata (W3C ``traceparent``)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())
