"""The plane's /metrics over several processes: one set of figures."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from warden_server.telemetry.metrics import merge_expositions

FIRST = """# HELP warden_decisions Begin decisions.
# TYPE warden_decisions counter
warden_decisions_total{code="none",stage="none",status="granted"} 3.0
warden_decisions_created{code="none",stage="none",status="granted"} 100.0
# HELP warden_policy_revision_info The policy revision in force (value 1).
# TYPE warden_policy_revision_info gauge
warden_policy_revision_info{revision="abc"} 1.0
# HELP warden_audit_commit_batch_size Transactions committed together.
# TYPE warden_audit_commit_batch_size histogram
warden_audit_commit_batch_size_bucket{le="1.0"} 2.0
warden_audit_commit_batch_size_bucket{le="+Inf"} 3.0
warden_audit_commit_batch_size_count 3.0
warden_audit_commit_batch_size_sum 4.0
"""

SECOND = """# HELP warden_decisions Begin decisions.
# TYPE warden_decisions counter
warden_decisions_total{code="none",stage="none",status="granted"} 4.0
warden_decisions_total{code="FORBIDDEN",stage="authorization",status="failed"} 1.0
warden_decisions_created{code="none",stage="none",status="granted"} 90.0
# HELP warden_policy_revision_info The policy revision in force (value 1).
# TYPE warden_policy_revision_info gauge
warden_policy_revision_info{revision="abc"} 1.0
# HELP warden_audit_commit_batch_size Transactions committed together.
# TYPE warden_audit_commit_batch_size histogram
warden_audit_commit_batch_size_bucket{le="1.0"} 1.0
warden_audit_commit_batch_size_bucket{le="+Inf"} 1.0
warden_audit_commit_batch_size_count 1.0
warden_audit_commit_batch_size_sum 1.0
"""


def test_counters_and_histograms_add_up_and_gauges_do_not() -> None:
    merged = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in merge_expositions([FIRST, SECOND])
        for s in family.samples
    }
    granted = (("code", "none"), ("stage", "none"), ("status", "granted"))
    assert merged[("warden_decisions_total", granted)] == 7
    assert merged[("warden_decisions_created", granted)] == 90
    forbidden = (("code", "FORBIDDEN"), ("stage", "authorization"), ("status", "failed"))
    assert merged[("warden_decisions_total", forbidden)] == 1
    assert merged[("warden_policy_revision_info", (("revision", "abc"),))] == 1
    assert merged[("warden_audit_commit_batch_size_bucket", (("le", "+Inf"),))] == 4
    assert merged[("warden_audit_commit_batch_size_sum", ())] == 5


class Peer:
    """A process's /metrics on a local port, whose exposition the test sets."""

    def __init__(self) -> None:
        import http.server
        import threading

        peer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = peer.text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                """Quiet."""

        self.text = ""
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def granted(text: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "warden_decisions_total" and s.labels.get("status") == "granted"
    )


def test_counters_never_go_down_when_a_process_ends_or_is_replaced() -> None:
    """Prometheus reads a lower counter as a reset and over-counts: what an
    ended process counted stays in the plane's sums, and a process that does
    not answer counts with what it said last; its gauges go with it."""
    from prometheus_client import CollectorRegistry, generate_latest

    from warden_server.telemetry.metrics import _Combined

    first, second = Peer(), Peer()
    first.text, second.text = FIRST, SECOND
    ports = [first.port, second.port]
    registry = CollectorRegistry()
    registry.register(_Combined(CollectorRegistry(), lambda: ports))

    def scraped() -> str:
        return generate_latest(registry).decode()

    try:
        assert granted(scraped()) == 7
        second.stop()  # does not answer: what it said last counts
        assert granted(scraped()) == 7
        ports.remove(second.port)  # ended, and another takes its place
        replacement = Peer()
        replacement.text = FIRST.replace("} 3.0", "} 1.0", 1)
        ports.append(replacement.port)
        assert granted(scraped()) == 3 + 4 + 1
        first.text = FIRST.replace("} 3.0", "} 2.0", 1)  # restarted on its port: counted afresh
        assert granted(scraped()) == 3 + 4 + 1 + 2
        revisions = [
            s for f in text_string_to_metric_families(scraped()) for s in f.samples
            if s.name == "warden_policy_revision_info"
        ]  # fmt: skip
        assert [s.value for s in revisions] == [1.0]  # gauges are the living processes'
    finally:
        for peer in (first, replacement):
            peer.stop()
