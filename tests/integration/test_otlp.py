"""``[telemetry] traces = "otlp"`` and ``metrics = "otlp"``: a real OTLP/HTTP
receiver gets the plane's spans and the figures ``/metrics`` serves, with the
configured headers, or with the endpoint and headers of the standard
``OTEL_EXPORTER_OTLP_*`` variables."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

from tests.conftest import ORDERS_TOKEN, load_example, make_config
from warden_server.app import serve
from warden_server.auth.actors import mint_token
from warden_server.config import Config
from warden_server.plane import Plane

# Each plane here sets its own process count (one), so these run once
# whatever counts WARDEN_TEST_PROCESSES lists.
pytestmark = pytest.mark.fixed_processes

Export = tuple[dict[str, str], Any]


class Collector:
    """An OTLP/HTTP endpoint for traces and metrics: decodes each export it
    is sent, by the path it is sent to."""

    def __init__(self) -> None:
        self.traces: queue.Queue[Export] = queue.Queue()
        self.metrics: queue.Queue[Export] = queue.Queue()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                export: ExportTraceServiceRequest | ExportMetricsServiceRequest
                if self.path == "/v1/metrics":
                    export, exports = ExportMetricsServiceRequest(), collector.metrics
                else:
                    export, exports = ExportTraceServiceRequest(), collector.traces
                export.ParseFromString(body)
                exports.put(
                    ({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}}, export)
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.base}/v1/traces"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()


@pytest.fixture
def collector() -> Iterator[Collector]:
    running = Collector()
    yield running
    running.server.shutdown()
    running.server.server_close()


def test_spans_reach_an_otlp_http_collector_with_the_configured_headers(
    tmp_path: Path, collector: Collector
) -> None:
    config = make_config(tmp_path, processes=1)
    config = config.model_validate(
        {
            **config.model_dump(),
            "telemetry": {
                "traces": "otlp",
                "otlp_endpoint": collector.url,
                "otlp_headers": {"x-api-key": "collector-key"},
            },
        }
    )
    server = serve(Plane.from_config(config), "127.0.0.1:0")
    rt = load_example().build_runtime(server.target, ORDERS_TOKEN)
    try:
        rt.register()
        actor = mint_token(config, subject="bot-7", roles=("support",), tenant="acme")
        env = rt.invoke("orders.get", {"order_id": "A1"}, actor=actor)
        assert env.status == "succeeded"
    finally:
        rt.close()
        server.stop(grace=0)  # flushes the batch
    names: set[str] = set()
    headers: dict[str, str] = {}
    while "warden.v1.Governor/Begin" not in names:
        headers, export = collector.traces.get(timeout=30)
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                names.update(span.name for span in scope.spans)
    assert headers["path"] == "/v1/traces"
    assert headers["x-api-key"] == "collector-key"
    assert headers["content-type"] == "application/x-protobuf"


def with_telemetry(config: Config, **telemetry: object) -> Config:
    return config.model_validate({**config.model_dump(), "telemetry": telemetry})


def one_granted_call(config: Config) -> Plane:
    """Serve a plane, make one call it grants, and stop it (which flushes
    every exporter); returns the stopped plane."""
    plane = Plane.from_config(config)
    server = serve(plane, "127.0.0.1:0")
    rt = load_example().build_runtime(server.target, ORDERS_TOKEN)
    try:
        rt.register()
        actor = mint_token(config, subject="bot-7", roles=("support",), tenant="acme")
        assert rt.invoke("orders.get", {"order_id": "A1"}, actor=actor).status == "succeeded"
    finally:
        rt.close()
        server.stop(grace=0)
    return plane


def last_metrics(collector: Collector) -> tuple[dict[str, str], dict[str, Metric]]:
    """The newest export the collector got (the one sent at shutdown), by name."""
    headers, export = collector.metrics.get(timeout=30)
    while not collector.metrics.empty():
        headers, export = collector.metrics.get_nowait()
    (resource,) = export.resource_metrics
    (scope,) = resource.scope_metrics
    return headers, {m.name: m for m in scope.metrics}


def attributes(point: Any) -> dict[str, str]:
    return {a.key: a.value.string_value for a in point.attributes}


def test_metrics_reach_an_otlp_http_collector_as_metrics_serves_them(
    tmp_path: Path, collector: Collector
) -> None:
    config = with_telemetry(
        make_config(tmp_path, processes=1),
        metrics="otlp",
        otlp_metrics_endpoint=f"{collector.base}/v1/metrics",
        otlp_headers={"x-api-key": "collector-key"},
    )
    plane = one_granted_call(config)
    headers, metrics = last_metrics(collector)
    assert headers["path"] == "/v1/metrics"
    assert headers["x-api-key"] == "collector-key"

    # Every family /metrics serves a sample of, under the same name, with the
    # same labels and figures.
    served = list(plane.telemetry.metrics.registry.collect())  # what /metrics renders
    assert {f.name for f in served if f.samples} == set(metrics)
    for family in served:
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            if family.type == "counter" and sample.name.endswith("_total"):
                (point,) = [
                    p for p in metrics[family.name].sum.data_points if attributes(p) == labels
                ]
                assert metrics[family.name].sum.is_monotonic
                assert point.as_double == sample.value
            elif family.type == "histogram" and sample.name.endswith("_count"):
                (point,) = [
                    p for p in metrics[family.name].histogram.data_points if attributes(p) == labels
                ]
                assert point.count == sample.value == sum(point.bucket_counts)
                assert len(point.bucket_counts) == len(point.explicit_bounds) + 1
            elif family.type == "gauge":
                (point,) = [
                    p for p in metrics[family.name].gauge.data_points if attributes(p) == labels
                ]
                assert point.as_double == sample.value

    decisions = metrics["warden_decisions"].sum.data_points
    assert [(attributes(p), p.as_double) for p in decisions] == [
        ({"stage": "none", "code": "none", "status": "granted"}, 1.0)
    ]
    (revision,) = metrics["warden_policy_revision_info"].gauge.data_points
    assert attributes(revision) == {"revision": plane.policies.current().revision}
    begin = [
        p
        for p in metrics["warden_rpc_duration_seconds"].histogram.data_points
        if attributes(p) == {"method": "warden.v1.Governor/Begin", "code": "OK"}
    ]
    assert [p.count for p in begin] == [1]
    assert list(begin[0].explicit_bounds)[:3] == [0.0005, 0.001, 0.0025]


def test_traces_and_metrics_read_the_standard_otel_variables_when_unset(
    tmp_path: Path, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.base)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=from-the-environment")
    config = with_telemetry(
        make_config(tmp_path, processes=1),
        traces="otlp",
        metrics="otlp",
        otlp_metrics_interval="1s",
    )
    plane = Plane.from_config(config)
    try:
        # Pushed every interval, not only at shutdown.
        headers, _ = collector.metrics.get(timeout=30)
        assert headers["path"] == "/v1/metrics"
        assert headers["x-api-key"] == "from-the-environment"
    finally:
        plane.close()
    one_granted_call(config)
    headers, metrics = last_metrics(collector)
    assert headers["x-api-key"] == "from-the-environment"
    assert "warden_decisions" in metrics
    headers, _ = collector.traces.get(timeout=30)
    assert headers["path"] == "/v1/traces"
    assert headers["x-api-key"] == "from-the-environment"


def test_a_metrics_interval_that_is_not_a_duration_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="otlp_metrics_interval: 'often' is not a duration"):
        with_telemetry(make_config(tmp_path, processes=1), otlp_metrics_interval="often")
