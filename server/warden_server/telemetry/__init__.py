"""Observability of one plane: traces, metrics and structured logs.

``Telemetry`` owns a tracer provider and a metrics registry of its own (not
the process-global ones), so several planes in one process, as in tests, keep
their figures apart. It observes the store (commit batches and the audit
records in them, policy loads and refusals included) and each pipeline step
(a span and a latency sample).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Final, TypeVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.trace import Tracer

from warden_server.policy.model import parse_duration
from warden_server.records.events import AuditEvent
from warden_server.telemetry.logs import fields, silence_leaky_loggers
from warden_server.telemetry.metrics import LatencySeries, Metrics, MetricsEndpoint

if TYPE_CHECKING:
    from warden_server.config import TelemetrySection
    from warden_server.pipeline.failure import Failure
    from warden_server.telemetry.otlp import MetricsPusher

P = TypeVar("P")
C = TypeVar("C")

STEP_STAGES: Final = {
    "resolve": "discovery",
    "authenticate": "authentication",
    "visibility": "discovery",
    "validate": "input-validation",
    "authorize": "authorization",
    "policy": "policy",
    "limits": "policy",
    "approval": "approval",
    "idempotency": "execution",
}
"""The contract stage each pipeline step fails in (SPEC §3); a step not
listed is labelled with its own name."""

audit_log = logging.getLogger("warden_server.audit")


def otlp_spans(endpoint: str | None, headers: Mapping[str, str] | None) -> SpanProcessor:
    """Spans batched to an OTLP/HTTP collector. An unset endpoint or headers
    are read by the exporter from ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (or
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``) and
    ``OTEL_EXPORTER_OTLP_HEADERS``, as every OpenTelemetry SDK does."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter = OTLPSpanExporter(endpoint=endpoint, headers=dict(headers) if headers else None)
    return BatchSpanProcessor(exporter, schedule_delay_millis=1000)


class Telemetry:
    """Traces, metrics and logs of one plane."""

    def __init__(
        self,
        *,
        traces: str = "none",
        otlp_endpoint: str | None = None,
        otlp_headers: Mapping[str, str] | None = None,
        metrics: str = "none",
        otlp_metrics_endpoint: str | None = None,
        otlp_metrics_interval: float = 60.0,
    ) -> None:
        silence_leaky_loggers()
        instance = f"{socket.gethostname()}:{os.getpid()}"
        resource = Resource.create({"service.name": "warden", "service.instance.id": instance})
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer: Tracer = self.tracer_provider.get_tracer("warden_server")
        self.tracing = False
        """Whether spans go anywhere. Until they do, none is made: a request
        only carries its caller's trace context, for the trace id it records."""
        if traces == "console":
            self.export_spans(SimpleSpanProcessor(ConsoleSpanExporter()))
        elif traces == "otlp":
            self.export_spans(otlp_spans(otlp_endpoint, otlp_headers))
        self.metrics = Metrics()
        self._step_series: dict[Callable[..., object], LatencySeries] = {}
        """Each pipeline step's latency series, looked up once."""
        self._pusher: MetricsPusher | None = None
        if metrics == "otlp":
            from warden_server.telemetry.otlp import MetricsPusher

            self._pusher = MetricsPusher(
                self.metrics.registry,
                resource,
                endpoint=otlp_metrics_endpoint,
                headers=otlp_headers,
                interval=otlp_metrics_interval,
            )
        self._endpoint: MetricsEndpoint | None = None
        self.peer_metrics_ports: tuple[int, ...] = ()
        """The ``/metrics`` ports of the plane's other processes, whose figures
        this process's ``/metrics`` adds to its own."""

    def export_spans(self, processor: SpanProcessor) -> None:
        """Send every span from now on to ``processor``."""
        self.tracer_provider.add_span_processor(processor)
        self.tracing = True

    @classmethod
    def from_config(cls, section: TelemetrySection) -> Telemetry:
        return cls(
            traces=section.traces,
            otlp_endpoint=section.otlp_endpoint,
            otlp_headers=section.otlp_headers,
            metrics=section.metrics,
            otlp_metrics_endpoint=section.otlp_metrics_endpoint,
            otlp_metrics_interval=parse_duration(section.otlp_metrics_interval),
        )

    def run_stage(self, step: Callable[[P, C], Failure | None], plane: P, ctx: C) -> Failure | None:
        """Run one pipeline step inside its own span, timing it."""
        series = self._step_series.get(step)
        if series is None:
            name = step.__name__
            series = self._step_series[step] = self.metrics.stage_seconds_of(
                STEP_STAGES.get(name, name), name
            )
        started = time.perf_counter()
        if not self.tracing:
            failure = step(plane, ctx)
        else:
            name = step.__name__
            stage = STEP_STAGES.get(name, name)
            with self.tracer.start_as_current_span(
                f"warden.{name}", attributes={"warden.stage": stage, "warden.step": name}
            ) as span:
                failure = step(plane, ctx)
                if failure is not None:
                    span.set_attributes({"warden.code": failure.code, "warden.failed": True})
        series.observe(time.perf_counter() - started)
        return failure

    def committed(self, transactions: int, events: Sequence[AuditEvent], seconds: float) -> None:
        """The store committed a batch: count it, and log each decision and outcome."""
        self.metrics.committed(transactions, events, seconds)
        if not audit_log.isEnabledFor(logging.INFO):
            return
        for event in events:
            if event.kind in ("decision", "outcome"):
                audit_log.info(
                    "%s %s",
                    event.kind,
                    event.status,
                    extra=fields(
                        kind=event.kind,
                        status=event.status,
                        stage=event.stage,
                        code=event.code,
                        capability_id=event.capability_id,
                        capability_version=event.capability_version,
                        service=event.service,
                        invocation_id=event.invocation_id,
                        reason=event.reason,
                        duration_ms=event.duration_ms,
                        trace_id=event.trace_id,
                    ),
                )

    def serve_metrics(self, listen: str) -> int:
        """Serve ``/metrics`` on ``listen`` (port 0 picks one); returns the port.

        Raises:
            OSError: the address cannot be bound.
        """
        if self._endpoint is None:
            self._endpoint = MetricsEndpoint(self.metrics, listen, lambda: self.peer_metrics_ports)
        return self._endpoint.port

    def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
        if self._pusher is not None:
            self._pusher.close()
            self._pusher = None
        self.tracer_provider.shutdown()


__all__ = ["STEP_STAGES", "Telemetry"]
