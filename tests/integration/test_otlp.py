"""``[telemetry] traces = "otlp"``: a real OTLP/HTTP receiver gets the plane's
spans, with the configured headers."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import ORDERS_TOKEN, load_example, make_config
from warden_server.app import serve
from warden_server.auth.actors import mint_token
from warden_server.plane import Plane


class Collector:
    """An OTLP/HTTP traces endpoint: decodes each export it is sent."""

    def __init__(self) -> None:
        self.exports: queue.Queue[tuple[dict[str, str], ExportTraceServiceRequest]] = queue.Queue()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                export = ExportTraceServiceRequest()
                export.ParseFromString(body)
                collector.exports.put(
                    ({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}}, export)
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


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
        headers, export = collector.exports.get(timeout=30)
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                names.update(span.name for span in scope.spans)
    assert headers["path"] == "/v1/traces"
    assert headers["x-api-key"] == "collector-key"
    assert headers["content-type"] == "application/x-protobuf"
