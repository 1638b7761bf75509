"""Traces, metrics and logs by stage, checked with an in-memory span exporter,
the plane's own metrics registry and captured log records; none of them
carries a sensitive value (SI-5)."""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import grpc
import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, Field

import warden
from tests.conftest import ORDERS_TOKEN, Plant, make_config
from tests.integration.approving import approval_rows, approver
from tests.integration.lab import EchoOut, write_lab_policies
from warden.v1 import errors_pb2, governor_pb2, governor_pb2_grpc
from warden_server.addresses import check_metrics_address
from warden_server.app import serve
from warden_server.config import config_from_dict
from warden_server.plane import Plane
from warden_server.telemetry.logs import JsonFormatter

# These tests read the plane's own memory (its spans, metrics, reloader and
# policy holder), which a second process would not share.
pytestmark = pytest.mark.single_process

GOVERNOR_BEGIN = "warden.v1.Governor/Begin"
GOVERNOR_COMPLETE_MANY = "warden.v1.Governor/CompleteMany"


@pytest.fixture
def spans(lab_plant: Plant) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    lab_plant.server.plane.telemetry.export_spans(SimpleSpanProcessor(exporter))
    return exporter


def sample(plant: Plant, name: str, **labels: str) -> float:
    plant.await_outcome_reports()
    value = plant.server.plane.telemetry.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def step_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [
        s for s in exporter.get_finished_spans() if s.attributes and "warden.step" in s.attributes
    ]


def rpc_spans(exporter: InMemorySpanExporter, method: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == method]


def decision(plant: Plant, invocation_id: str) -> dict[str, Any]:
    (row,) = plant.events(invocation_id=invocation_id, kind="decision")
    return row


# -- traces --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capability", "arguments", "steps", "code"),
    [
        (
            "orders.echo",
            {"n": 1},
            [
                "authenticate",
                "resolve",
                "visibility",
                "validate",
                "authorize",
                "policy",
                "idempotency",
                "limits",
                "approval",
            ],
            None,
        ),
        (
            "orders.echo",
            {"n": 500},
            ["authenticate", "resolve", "visibility", "validate", "authorize", "policy"],
            "POLICY_DENIED",
        ),
        (
            "orders.echo",
            {"n": -5},
            ["authenticate", "resolve", "visibility", "validate"],
            "INPUT_INVALID",
        ),
        ("orders.nothing", {"n": 1}, ["authenticate", "resolve"], "CAPABILITY_NOT_FOUND"),
        (
            "orders.secret",
            {"n": 1},
            ["authenticate", "resolve", "visibility"],
            "CAPABILITY_NOT_FOUND",
        ),
    ],
)
def test_one_span_per_stage_that_ran_in_the_decisions_trace(
    lab_plant: Plant,
    lab_rt: warden.Runtime,
    spans: InMemorySpanExporter,
    capability: str,
    arguments: dict[str, Any],
    steps: list[str],
    code: str | None,
) -> None:
    env = lab_rt.invoke(capability, arguments, actor=lab_plant.token())
    (begin,) = rpc_spans(spans, GOVERNOR_BEGIN)
    ran = step_spans(spans)
    assert [s.attributes["warden.step"] for s in ran if s.attributes] == steps
    stages = {"resolve": "discovery", "visibility": "discovery", "validate": "input-validation"}
    for span in ran:
        assert span.parent is not None and span.parent.span_id == begin.context.span_id
        assert span.context.trace_id == begin.context.trace_id
        assert span.attributes is not None
        step = span.attributes["warden.step"]
        assert span.attributes["warden.stage"] == stages.get(
            str(step), span.attributes["warden.stage"]
        )
    failed = [s.attributes.get("warden.code") for s in ran if s.attributes]
    assert failed == [None] * (len(steps) - 1) + [code]
    record = decision(lab_plant, env.invocation_id)
    assert record["trace_id"] == format(begin.context.trace_id, "032x")


def test_the_sdk_propagates_the_callers_trace_to_the_plane(
    lab_plant: Plant, lab_rt: warden.Runtime, spans: InMemorySpanExporter
) -> None:
    caller = TracerProvider()
    caller_spans = InMemorySpanExporter()
    caller.add_span_processor(SimpleSpanProcessor(caller_spans))
    with caller.get_tracer("agent").start_as_current_span("agent-step") as step:
        env = lab_rt.invoke("orders.echo", {"n": 3}, actor=lab_plant.token())
    assert env.status == "succeeded"
    trace_id = format(step.get_span_context().trace_id, "032x")
    records = lab_plant.events(invocation_id=env.invocation_id)
    assert [r["kind"] for r in records] == ["decision", "outcome"]
    assert {r["trace_id"] for r in records} == {trace_id}
    assert lab_rt.flush(timeout_ms=10_000) == 0
    # Begin's call, and the report's own span inside whichever CompleteMany
    # call brought it, are both children of the caller's step.
    for name in (GOVERNOR_BEGIN, "warden.complete"):
        (span,) = rpc_spans(spans, name)
        assert span.parent is not None and span.parent.span_id == step.get_span_context().span_id
        assert span.parent.is_remote


def test_without_a_caller_trace_decision_and_outcome_share_one(
    lab_plant: Plant, lab_rt: warden.Runtime
) -> None:
    first = lab_rt.invoke("orders.echo", {"n": 3}, actor=lab_plant.token())
    second = lab_rt.invoke("orders.echo", {"n": 4}, actor=lab_plant.token())
    traces = [
        {r["trace_id"] for r in lab_plant.events(invocation_id=e.invocation_id)}
        for e in (first, second)
    ]
    assert all(len(t) == 1 and None not in t for t in traces)
    assert traces[0] != traces[1]


class StartedSpans(SpanProcessor):
    """The name of every span started under the provider it is added to."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.names.append(span.name)


def test_no_span_is_made_while_traces_go_nowhere(lab_plant: Plant, lab_rt: warden.Runtime) -> None:
    """With ``[telemetry] traces`` off (the default) a request costs no span:
    not its call's, its stages', nor its report's. The records still carry
    the caller's trace."""
    telemetry = lab_plant.server.plane.telemetry
    assert not telemetry.tracing
    started = StartedSpans()
    telemetry.tracer_provider.add_span_processor(started)
    caller = TracerProvider()
    with caller.get_tracer("agent").start_as_current_span("agent-step") as step:
        granted = lab_rt.invoke("orders.echo", {"n": 3}, actor=lab_plant.token())
        denied = lab_rt.invoke("orders.echo", {"n": 500}, actor=lab_plant.token())
    assert granted.status == "succeeded"
    assert denied.error is not None and denied.error.code == "POLICY_DENIED"
    assert lab_rt.flush(timeout_ms=10_000) == 0
    trace_id = format(step.get_span_context().trace_id, "032x")
    records = lab_plant.events(trace_id=trace_id)
    assert sorted(r["kind"] for r in records) == ["decision", "decision", "outcome"]
    assert started.names == []


def test_approval_records_carry_the_trace_they_were_written_in(
    lab_plant: Plant, lab_rt: warden.Runtime, spans: InMemorySpanExporter
) -> None:
    arguments = {"n": 42, "note": "please"}
    suspended = lab_rt.invoke("orders.echo", arguments, actor=lab_plant.token())
    assert suspended.status == "suspended" and suspended.approval_id
    with approver(lab_plant) as approvals:
        approvals.approve(suspended.approval_id, reason="fine")
    resumed = lab_rt.invoke(
        "orders.echo", arguments, actor=lab_plant.token(), approval_id=suspended.approval_id
    )
    assert resumed.status == "succeeded"
    rows = {r["status"]: r for r in approval_rows(lab_plant, suspended.approval_id)}
    assert list(rows) == ["requested", "approved", "consumed"]
    assert rows["requested"]["trace_id"] == decision(lab_plant, suspended.invocation_id)["trace_id"]
    (approve,) = rpc_spans(spans, "warden.v1.Approvals/Approve")
    assert rows["approved"]["trace_id"] == format(approve.context.trace_id, "032x")
    assert rows["consumed"]["trace_id"] == decision(lab_plant, resumed.invocation_id)["trace_id"]
    assert len({r["trace_id"] for r in rows.values()}) == 3


# -- metrics ----------------------------------------------------------------------


def test_decisions_and_outcomes_are_counted_as_the_audit_log_records_them(
    lab_plant: Plant, lab_rt: warden.Runtime
) -> None:
    token = lab_plant.token()
    for arguments in ({"n": 1}, {"n": 2}, {"n": 500}, {"n": 42}, {"n": 1, "note": "lie"}):
        lab_rt.invoke("orders.echo", arguments, actor=token)
    lab_rt.invoke("orders.nothing", {"n": 1}, actor=token)
    expected = lab_plant.rows(
        "SELECT kind, coalesce(stage, 'none') AS stage, coalesce(code, 'none') AS code, "
        "status, count(*) AS n FROM audit_events WHERE kind IN ('decision', 'outcome') "
        "GROUP BY kind, stage, code, status"
    )
    assert len(expected) >= 6
    for row in expected:
        name = "warden_decisions_total" if row["kind"] == "decision" else "warden_outcomes_total"
        labels = {"stage": row["stage"], "code": row["code"], "status": row["status"]}
        assert sample(lab_plant, name, **labels) == row["n"], row
    assert (
        sample(
            lab_plant,
            "warden_decisions_total",
            stage="policy",
            code="POLICY_DENIED",
            status="failed",
        )
        == 1
    )
    assert (
        sample(
            lab_plant,
            "warden_outcomes_total",
            stage="output-validation",
            code="OUTPUT_INVALID",
            status="failed",
        )
        == 1
    )


def test_metric_code_labels_stay_bounded_whatever_codes_a_service_reports(
    lab_plant: Plant, lab_rt: warden.Runtime
) -> None:
    """Undeclared codes reported by Complete fold into one label value; declared
    and built-in codes keep their own; the audit log keeps every code."""
    reported = [f"MADE_UP_{i}" for i in range(40)] + ["NOT_ELIGIBLE", "INTERNAL_ERROR"]
    with grpc.insecure_channel(lab_plant.target) as channel:
        governor = governor_pb2_grpc.GovernorStub(channel)
        for code in reported:
            invocation_id = str(uuid.uuid4())
            granted = governor.Begin(
                governor_pb2.BeginRequest(
                    invocation_id=invocation_id,
                    capability_id="orders.echo",
                    actor_token=lab_plant.token(),
                    input_json='{"n": 1}',
                ),
                metadata=(("x-warden-service-token", ORDERS_TOKEN),),
                timeout=10,
            )
            governor.Complete(
                governor_pb2.CompleteRequest(
                    invocation_id=invocation_id,
                    grant_token=granted.grant.token,
                    status=governor_pb2.OUTCOME_STATUS_FAILED,
                    failure=errors_pb2.Failure(code=code, stage="execution", public_message="No."),
                ),
                metadata=(("x-warden-service-token", ORDERS_TOKEN),),
                timeout=10,
            )
    exposition = lab_plant.server.plane.telemetry.metrics.exposition().decode()
    assert "MADE_UP_" not in exposition
    outcome = {"stage": "execution", "status": "failed"}
    assert sample(lab_plant, "warden_outcomes_total", code="undeclared", **outcome) == 40
    assert sample(lab_plant, "warden_outcomes_total", code="NOT_ELIGIBLE", **outcome) == 1
    assert sample(lab_plant, "warden_outcomes_total", code="INTERNAL_ERROR", **outcome) == 1
    recorded = {r["code"] for r in lab_plant.events(kind="outcome")}
    assert set(reported) <= recorded


def test_latency_is_observed_per_rpc_and_per_stage(
    lab_plant: Plant, lab_rt: warden.Runtime
) -> None:
    token = lab_plant.token()
    for n in (1, 2, 500):
        lab_rt.invoke("orders.echo", {"n": n}, actor=token)
    count = "warden_rpc_duration_seconds_count"
    assert lab_rt.flush(timeout_ms=10_000) == 0
    assert sample(lab_plant, count, method=GOVERNOR_BEGIN, code="OK") == 3
    # The two outcomes (500 is refused) travel in one or two report calls.
    assert sample(lab_plant, count, method=GOVERNOR_COMPLETE_MANY, code="OK") in (1, 2)
    succeeded = {"stage": "none", "code": "none", "status": "succeeded"}
    assert sample(lab_plant, "warden_outcomes_total", **succeeded) == 2
    assert sample(lab_plant, count, method="warden.v1.Registry/Register", code="OK") == 1
    stage = "warden_stage_duration_seconds_count"
    assert sample(lab_plant, stage, stage="policy", step="policy") == 3
    assert sample(lab_plant, stage, stage="approval", step="approval") == 2
    assert sample(lab_plant, stage, stage="discovery", step="visibility") == 3
    assert sample(lab_plant, "warden_stage_duration_seconds_sum", stage="policy", step="policy") > 0


def test_failed_rpcs_are_observed_with_their_status_code(lab_plant: Plant) -> None:
    rt = warden.Runtime(lab_plant.target, service="orders", token="wrong-token")

    @rt.capability("orders.echo", input=EchoOut, output=EchoOut, side_effect="read")
    def echo(inp: EchoOut, ctx: warden.Context) -> EchoOut:
        return inp

    try:
        with pytest.raises(warden.WardenError):
            rt.register()
    finally:
        rt.close()
    assert (
        sample(
            lab_plant,
            "warden_rpc_duration_seconds_count",
            method="warden.v1.Registry/Register",
            code="UNAUTHENTICATED",
        )
        == 1
    )
    # Begin, a coroutine on the server's loop, is observed the same way.
    with (
        grpc.insecure_channel(lab_plant.target) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        governor_pb2_grpc.GovernorStub(channel).Begin(
            governor_pb2.BeginRequest(invocation_id=str(uuid.uuid4())),
            metadata=(("x-warden-service-token", "wrong-token"),),
        )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    observed = sample(
        lab_plant,
        "warden_rpc_duration_seconds_count",
        method=GOVERNOR_BEGIN,
        code="UNAUTHENTICATED",
    )
    assert observed == 1


def test_audit_commit_batches_are_counted(lab_plant: Plant, lab_rt: warden.Runtime) -> None:
    lab_rt.invoke("orders.echo", {"n": 1}, actor=lab_plant.token())
    plane = lab_plant.server.plane
    batches = sample(lab_plant, "warden_audit_commit_batch_size_count")
    assert batches == plane.store.batches_committed  # type: ignore[attr-defined]
    assert sample(lab_plant, "warden_audit_commit_batch_size_sum") >= batches


def test_policy_loads_and_refusals_are_counted_as_they_are_recorded(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    folder = write_lab_policies(tmp_path / "live")
    plant = start_plane(folder, watch_policies=False)
    plane = plant.server.plane
    first = plane.policies.current().revision
    assert sample(plant, "warden_policy_reloads_total", result="ok") == 1  # the start
    assert sample(plant, "warden_policy_revision_info", revision=first) == 1

    policies = folder / "lab.yaml"
    policies.write_text(policies.read_text() + "\n# a new revision\n")
    assert plane.reloader.reload() == "loaded"
    second = plane.policies.current().revision
    assert sample(plant, "warden_policy_reloads_total", result="ok") == 2
    assert sample(plant, "warden_policy_revision_info", revision=second) == 1
    assert sample(plant, "warden_policy_revision_info", revision=first) == 0

    (folder / "zz-broken.yaml").write_text("rules:\n  - id: broken\n    effect: maybe\n")
    assert plane.reloader.reload() == "rejected"
    assert sample(plant, "warden_policy_reloads_total", result="failed") == 1
    assert sample(plant, "warden_policy_revision_info", revision=second) == 1
    recorded = [r["status"] for r in plant.events(kind="policy")]
    assert recorded == ["loaded", "loaded", "rejected"]


def _scrape(tmp_path: Path, listen: str, host: str) -> str:
    base = make_config(tmp_path, write_lab_policies(tmp_path / "lab"))
    data = base.model_dump(mode="json", exclude={"base_dir"})
    data["telemetry"] = {"metrics_listen": listen}
    config = config_from_dict(data, base_dir=tmp_path)
    with serve(Plane.from_config(config), "127.0.0.1:0") as server:
        assert server.metrics_port
        url = f"http://{host}:{server.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())


def test_metrics_are_served_over_http_where_the_config_says(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    body = _scrape(tmp_path, "127.0.0.1:0", "127.0.0.1")
    assert "# TYPE warden_decisions_total counter" in body
    assert "# TYPE warden_audit_commit_batch_size histogram" in body
    assert 'warden_policy_reloads_total{result="ok"} 1.0' in body
    assert "GET /metrics" not in capfd.readouterr().err, "a scrape is not a line of the log"


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_metrics_listen_takes_an_ipv6_address_in_brackets(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
        port = probe.getsockname()[1]
    listen = f"[::1]:{port}"
    check_metrics_address(listen)  # what warden serve checks before it starts anything
    body = _scrape(tmp_path, listen, "[::1]")
    assert "# TYPE warden_decisions_total counter" in body


# -- logs --------------------------------------------------------------------------


def test_each_decision_and_outcome_is_one_structured_log_line(
    lab_plant: Plant, lab_rt: warden.Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="warden_server.audit"):
        env = lab_rt.invoke("orders.echo", {"n": 500}, actor=lab_plant.token())
    lines = [
        json.loads(JsonFormatter().format(r))
        for r in caplog.records
        if r.name == "warden_server.audit"
    ]
    (line,) = [entry for entry in lines if entry.get("invocation_id") == env.invocation_id]
    assert line["message"] == "decision failed"
    assert (line["kind"], line["stage"], line["code"]) == ("decision", "policy", "POLICY_DENIED")
    assert line["capability_id"] == "orders.echo" and line["level"] == "INFO"
    assert line["trace_id"] == decision(lab_plant, env.invocation_id)["trace_id"]
    assert line["reason"] == "denied-by-rule:lab-deny-big"


# -- SI-5: nothing sensitive in traces, metrics or logs ---------------------------------


class LoginIn(BaseModel):
    user: str
    password: Annotated[str, Field(json_schema_extra={"x-warden-sensitive": True})]


class LoginOut(BaseModel):
    token: Annotated[str, Field(json_schema_extra={"x-warden-sensitive": True})]


SECRET_IN = "correct-horse-battery-staple"
SECRET_OUT = "session-4f1d9c2b7e"


@pytest.fixture
def login_rt(lab_plant: Plant) -> Iterator[warden.Runtime]:
    rt = warden.Runtime(lab_plant.target, service="orders", token=ORDERS_TOKEN)

    @rt.capability("orders.login", input=LoginIn, output=LoginOut, side_effect="write")
    def login(inp: LoginIn, ctx: warden.Context) -> LoginOut:
        if inp.user == "explode":
            raise RuntimeError(f"bad password {inp.password}")
        return LoginOut(token=SECRET_OUT)

    rt.register()
    yield rt
    rt.close()


def test_si5_no_sensitive_value_reaches_spans_metrics_or_logs(
    lab_plant: Plant,
    login_rt: warden.Runtime,
    spans: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
    lab_rt: warden.Runtime,
) -> None:
    token = lab_plant.token()
    with caplog.at_level(logging.DEBUG):
        ok = login_rt.invoke("orders.login", {"user": "ann", "password": SECRET_IN}, actor=token)
        boom = login_rt.invoke(
            "orders.login", {"user": "explode", "password": SECRET_IN}, actor=token
        )
        denied = lab_rt.invoke("orders.echo", {"n": 500, "note": SECRET_IN}, actor=token)
    assert (ok.status, boom.status, denied.status) == ("succeeded", "failed", "failed")
    # The values did reach the plane: its audit store has them only redacted.
    records = {r["invocation_id"]: r for r in lab_plant.events(kind="decision")}
    assert SECRET_IN not in records[ok.invocation_id]["input"]
    (cause,) = lab_plant.events(invocation_id=boom.invocation_id, kind="outcome")
    assert cause["cause_message"] == "bad password [REDACTED]"

    exported = "\n".join(s.to_json() for s in spans.get_finished_spans())
    metrics = lab_plant.server.plane.telemetry.metrics.exposition().decode()
    logs = "\n".join(JsonFormatter().format(r) for r in caplog.records)
    assert exported and metrics and logs
    for private in (SECRET_IN, SECRET_OUT, "Use a number of at most 100.", "bad password"):
        assert private not in exported, private
        assert private not in metrics, private
        assert private not in logs, private


def test_text_logs_carry_the_same_fields(
    lab_plant: Plant, lab_rt: warden.Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    from warden_server.telemetry.logs import TextFormatter

    with caplog.at_level(logging.INFO, logger="warden_server.audit"):
        env = lab_rt.invoke("orders.echo", {"n": 1}, actor=lab_plant.token())
    lines = [TextFormatter().format(r) for r in caplog.records if r.name == "warden_server.audit"]
    assert any(
        f"invocation_id={env.invocation_id}" in line and "kind=decision" in line for line in lines
    )


def _slow_stop_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "has taken more than" in r.getMessage()]


def test_a_stop_that_takes_long_logs_where_every_thread_is(
    lab_plant: Plant, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plane that does not stop says where it waits: past ``slow_stop_s``
    (here 10 ms), a warning carries the stack of every thread, the stopping
    one in its stop. The stop's first step is held until the warning is out,
    so the watch cannot find the stop already over however late it runs."""
    server = lab_plant.server
    server.slow_stop_s = 0.01
    stopping = server.plane.reloader.stopping

    def held_stopping() -> None:
        deadline = time.monotonic() + 30
        while not _slow_stop_warnings(caplog) and time.monotonic() < deadline:
            time.sleep(0.005)
        stopping()

    monkeypatch.setattr(server.plane.reloader, "stopping", held_stopping)
    with caplog.at_level(logging.WARNING, logger="warden_server.app"):
        server.stop(grace=0)
    (warning,) = _slow_stop_warnings(caplog)
    assert warning.startswith("stopping has taken more than 0.01 s; the threads of process")
    assert "thread MainThread:" in warning
    assert "in test_a_stop_that_takes_long_logs_where_every_thread_is\n" in warning
    assert ", in stop\n" in warning, warning
    assert "thread warden-loop:" in warning


def test_a_quick_stop_logs_nothing(lab_plant: Plant, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="warden_server.app"):
        lab_plant.server.stop(grace=0)
    assert not _slow_stop_warnings(caplog)
