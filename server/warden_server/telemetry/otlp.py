"""The figures ``/metrics`` serves, pushed to an OpenTelemetry collector.

Every interval, and once more on close, this process's Prometheus registry is
read and sent over OTLP/HTTP: the same metric names and labels, a counter as a
cumulative monotonic sum, a histogram with its buckets, a gauge as a gauge.
Each process sends its own figures under its own ``service.instance.id``;
the collector adds them up, as Prometheus does over scrape targets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Final

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric as Family

log = logging.getLogger(__name__)

SCOPE: Final = InstrumentationScope("warden_server")
_NS: Final = 1_000_000_000

Labels = tuple[tuple[str, str], ...]


def metrics_data(registry: CollectorRegistry, resource: Resource, since_ns: int) -> MetricsData:
    """The registry's figures now, as OTLP metrics; a series without a
    ``_created`` time counts from ``since_ns``."""
    now = time.time_ns()
    metrics = [m for family in registry.collect() if (m := _metric(family, since_ns, now))]
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=resource,
                scope_metrics=[ScopeMetrics(scope=SCOPE, metrics=metrics, schema_url="")],
                schema_url="",
            )
        ]
    )


def _metric(family: Family, since_ns: int, now: int) -> Metric | None:
    series: dict[Labels, dict[str, float]] = {}
    buckets: dict[Labels, list[tuple[float, float]]] = {}
    for sample in family.samples:
        labels = dict(sample.labels)
        bound = labels.pop("le", None)
        key = tuple(sorted(labels.items()))
        suffix = sample.name.removeprefix(family.name)
        if bound is not None:
            buckets.setdefault(key, []).append((float(bound), sample.value))
        else:
            series.setdefault(key, {})[suffix] = sample.value
    if not series:
        return None

    def start(values: Mapping[str, float]) -> int:
        created = values.get("_created")
        return int(created * _NS) if created is not None else since_ns

    data: Sum | Histogram | Gauge
    if family.type == "counter":
        data = Sum(
            data_points=[
                # A Prometheus sample is a double, whatever a collector put in it
                # (prometheus_client's GCCollector counts in ints).
                NumberDataPoint(dict(key), start(values), now, float(values.get("_total", 0.0)))
                for key, values in series.items()
            ],
            aggregation_temporality=AggregationTemporality.CUMULATIVE,
            is_monotonic=True,
        )
    elif family.type == "histogram":
        data = Histogram(
            data_points=[
                _histogram_point(dict(key), values, buckets.get(key, []), start(values), now)
                for key, values in series.items()
            ],
            aggregation_temporality=AggregationTemporality.CUMULATIVE,
        )
    elif family.type == "gauge":
        data = Gauge(
            data_points=[
                NumberDataPoint(dict(key), start(values), now, float(values.get("", 0.0)))
                for key, values in series.items()
            ]
        )
    else:  # the plane defines no summaries or untyped metrics
        return None
    return Metric(name=family.name, description=family.documentation, unit="", data=data)


def _histogram_point(
    labels: dict[str, str],
    values: Mapping[str, float],
    cumulative: Iterable[tuple[float, float]],
    start_ns: int,
    now: int,
) -> HistogramDataPoint:
    # Prometheus buckets count everything up to their bound (the last, +Inf,
    # counts all); OTLP buckets count what falls between two bounds.
    ordered = sorted(cumulative)
    counts = [int(count) for _, count in ordered]
    return HistogramDataPoint(
        attributes=labels,
        start_time_unix_nano=start_ns,
        time_unix_nano=now,
        count=int(values.get("_count", 0)),
        sum=values.get("_sum", 0.0),
        bucket_counts=[c - (counts[i - 1] if i else 0) for i, c in enumerate(counts)],
        explicit_bounds=[bound for bound, _ in ordered if bound != float("inf")],
        min=None,  # type: ignore[arg-type]  # Prometheus keeps neither; OTLP's are optional
        max=None,  # type: ignore[arg-type]
    )


class MetricsPusher:
    """Sends a registry's figures to an OTLP/HTTP collector every ``interval``
    seconds on a thread of its own, and once more on ``close``.

    An unset endpoint or headers are read by the exporter from
    ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_ENDPOINT``
    + ``/v1/metrics``) and ``OTEL_EXPORTER_OTLP_HEADERS``, as every
    OpenTelemetry SDK does.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        resource: Resource,
        *,
        endpoint: str | None,
        headers: Mapping[str, str] | None,
        interval: float,
    ) -> None:
        self._registry = registry
        self._resource = resource
        self._since = time.time_ns()
        self._exporter = OTLPMetricExporter(
            endpoint=endpoint, headers=dict(headers) if headers else None
        )
        self._interval = interval
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="warden-otlp-metrics", daemon=True)
        self._thread.start()

    def push(self) -> bool:
        """Send the figures now; False when the collector did not take them."""
        with self._lock:
            data = metrics_data(self._registry, self._resource, self._since)
            return self._exporter.export(data) is MetricExportResult.SUCCESS

    def _run(self) -> None:
        while not self._stopping.wait(self._interval):
            if not self.push():
                log.warning("the OTLP collector did not take the metrics; sending again later")

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        if not self.push():
            log.warning("the OTLP collector did not take the last metrics")
        self._exporter.shutdown()


__all__ = ["MetricsPusher", "metrics_data"]
