"""CompleteMany: many outcome reports in one call, each answered as Complete
answers it alone, the taken ones committed together."""

from __future__ import annotations

import dataclasses
import secrets
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

import warden
from tests.conftest import ORDERS_TOKEN, Plant, make_config, one_process
from tests.integration.lab import Lab, build_lab, write_lab_policies
from tests.integration.test_rpc_input import (
    ORDERS,
    Stubs,
    assert_chain_intact,
    begin_grant,
    complete_request,
    failed_outcome,
    forge_grant,
    invocation_state,
    open_stubs,
)
from warden.v1 import errors_pb2, governor_pb2
from warden_server.app import Server, serve
from warden_server.plane import Plane

Answer = int | tuple[str, str]
"""A report's answer: the record's sequence number, or a refusal's code and message."""


@pytest.fixture
def metered_plant(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Plant]:
    """The lab plane with its metrics served over HTTP (every process's, merged)."""
    config = make_config(tmp_path, write_lab_policies(tmp_path / "lab"), **one_process(request))
    config = config.model_copy(
        update={"telemetry": config.telemetry.model_copy(update={"metrics_listen": "127.0.0.1:0"})}
    )
    server: Server = serve(Plane.from_config(config), "127.0.0.1:0")
    try:
        yield Plant(server, tmp_path)
    finally:
        server.stop(grace=0)


@pytest.fixture
def stubs(lab_plant: Plant, lab_rt: warden.Runtime) -> Iterator[Stubs]:
    with open_stubs(lab_plant) as opened:
        yield opened


def report(
    request: governor_pb2.CompleteRequest, trace_context: dict[str, str] | None = None
) -> governor_pb2.OutcomeReport:
    return governor_pb2.OutcomeReport(request=request, trace_context=trace_context or {})


def complete_many(stubs: Stubs, reports: list[governor_pb2.OutcomeReport]) -> list[Answer]:
    response = stubs.governor.CompleteMany(
        governor_pb2.CompleteManyRequest(reports=reports), metadata=ORDERS, timeout=30
    )
    assert len(response.results) == len(reports)
    return [
        r.audit_seq
        if r.WhichOneof("result") == "audit_seq"
        else (r.refusal.code, r.refusal.message)
        for r in response.results
    ]


def complete_alone(stubs: Stubs, request: governor_pb2.CompleteRequest) -> Answer:
    try:
        return stubs.governor.Complete(request, metadata=ORDERS, timeout=10).audit_seq
    except grpc.RpcError as error:
        return (error.code().name, error.details() or "")


def unknown_invocation_grant(plant: Plant, token: str) -> tuple[str, str]:
    """A grant the plane signed, for an invocation it never began."""
    grants = plant.server.plane.grants
    invocation_id = str(uuid.uuid4())
    claims = dataclasses.replace(grants.verify(token), invocation_id=invocation_id)
    return invocation_id, grants.sign(claims)


def test_each_report_is_answered_as_complete_answers_it_alone(
    lab_plant: Plant, stubs: Stubs
) -> None:
    (a, a_token), (b, b_token), (c, c_token), (d, d_token) = (
        begin_grant(stubs, lab_plant) for _ in range(4)
    )
    earlier = complete_alone(stubs, complete_request(c, c_token))
    unknown, unknown_token = unknown_invocation_grant(lab_plant, d_token)
    failed = {"status": governor_pb2.OUTCOME_STATUS_FAILED, "output_json": ""}
    requests = [
        complete_request(a, a_token),
        complete_request(b, b_token, **failed, failure=failed_outcome()),
        complete_request(a, a_token),  # the same report again, in the same call
        complete_request(c, c_token),  # the same report as one made before
        complete_request(c, c_token, **failed, failure=failed_outcome()),
        complete_request(b, b_token),  # another outcome, in the same call
        complete_request(d, forge_grant(d_token)),
        complete_request(unknown, unknown_token),
        complete_request(d, d_token, status=governor_pb2.OUTCOME_STATUS_UNSPECIFIED),
        complete_request(
            d,
            d_token,
            **failed,
            failure=errors_pb2.Failure(code="NOT_ELIGIBLE", stage="execution", details_json="{"),
        ),
        complete_request(d, d_token, output_json="{n: 1}"),
    ]

    answers = complete_many(stubs, [report(r) for r in requests])

    seq_a, seq_b = answers[0], answers[1]
    assert isinstance(seq_a, int) and isinstance(seq_b, int)
    assert answers[2:9] == [
        seq_a,
        earlier,
        ("ALREADY_EXISTS", f"another outcome of {c} was already reported"),
        ("ALREADY_EXISTS", f"another outcome of {b} was already reported"),
        ("PERMISSION_DENIED", "grant not accepted: grant rejected: bad signature"),
        ("NOT_FOUND", f"no granted invocation {unknown}"),
        ("INVALID_ARGUMENT", "status must be SUCCEEDED, FAILED or CANCELLED"),
    ]
    details_code, details_message = answers[9]
    output_code, output_message = answers[10]
    assert details_code == output_code == "INVALID_ARGUMENT"
    assert details_message.startswith("failure.details_json is not valid JSON")
    assert output_message.startswith("output_json is not valid JSON")
    # Complete, asked the same afterwards, answers each report the same.
    assert [complete_alone(stubs, r) for r in requests] == answers

    outcomes = {r["invocation_id"]: r for r in lab_plant.events(kind="outcome")}
    assert sorted(outcomes) == sorted([a, b, c])
    assert (outcomes[a]["seq"], outcomes[a]["status"]) == (seq_a, "succeeded")
    assert (outcomes[b]["seq"], outcomes[b]["status"]) == (seq_b, "failed")
    assert outcomes[c]["seq"] == earlier
    assert [invocation_state(lab_plant, i) for i in (a, b, c, d)] == ["completed"] * 3 + ["granted"]
    assert_chain_intact(lab_plant)


def test_the_reports_of_one_call_are_committed_in_one_batch(metered_plant: Plant) -> None:
    """17 reports in one call make one batch of more than 16 transactions: split
    into two batches, no batch would be that large."""
    with open_stubs(metered_plant) as stubs:
        lab = build_lab(metered_plant.target, ORDERS_TOKEN, Lab())
        try:
            lab.register()
        finally:
            lab.close()
        grants = [begin_grant(stubs, metered_plant) for _ in range(17)]
        large = large_batches(metered_plant)
        answers = complete_many(stubs, [report(complete_request(i, t)) for i, t in grants])
    assert all(isinstance(a, int) for a in answers)
    assert sorted(answers) == [r["seq"] for r in metered_plant.events(kind="outcome")]
    assert large_batches(metered_plant) == large + 1
    # The telemetry interceptor observes the call as it does every RPC.
    calls = {"method": "warden.v1.Governor/CompleteMany", "code": "OK"}
    assert samples(metered_plant, "warden_rpc_duration_seconds_count", **calls) == [1.0]


def samples(plant: Plant, name: str, **labels: str) -> list[float]:
    """The values of a metric's samples with these labels, from every process."""
    url = f"http://127.0.0.1:{plant.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as page:
        text = page.read().decode()
    return [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]


def large_batches(plant: Plant) -> float:
    """How many batches committed more than 16 transactions, in every process."""
    bucket = "warden_audit_commit_batch_size_bucket"
    (everything,) = samples(plant, bucket, le="+Inf")
    (up_to_16,) = samples(plant, bucket, le="16.0")
    return everything - up_to_16


def traceparent() -> tuple[str, dict[str, str]]:
    trace_id = secrets.token_hex(16)
    return trace_id, {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}


def test_each_outcome_record_carries_its_own_reports_trace(lab_plant: Plant, stubs: Stubs) -> None:
    grants = [begin_grant(stubs, lab_plant) for _ in range(3)]
    traces = [traceparent() for _ in grants]
    untraced_id, untraced_token = begin_grant(stubs, lab_plant)
    reports = [
        report(complete_request(i, t), carrier)
        for (i, t), (_, carrier) in zip(grants, traces, strict=True)
    ]
    reports.append(report(complete_request(untraced_id, untraced_token)))
    # The call's own trace is none of the reports'.
    _, call_trace = traceparent()
    stubs.governor.CompleteMany(
        governor_pb2.CompleteManyRequest(reports=reports),
        metadata=(*ORDERS, *call_trace.items()),
        timeout=30,
    )
    recorded = {r["invocation_id"]: r["trace_id"] for r in lab_plant.events(kind="outcome")}
    assert [recorded[i] for i, _ in grants] == [trace_id for trace_id, _ in traces]
    assert recorded[untraced_id] is None


def test_more_than_256_reports_are_refused_whole(lab_plant: Plant, stubs: Stubs) -> None:
    invocation_id, token = begin_grant(stubs, lab_plant)
    reports = [report(complete_request(invocation_id, token))] * 257
    with pytest.raises(grpc.RpcError) as raised:
        complete_many(stubs, reports)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == "a call carries at most 256 reports, not 257"
    assert invocation_state(lab_plant, invocation_id) == "granted"
    # 256 are taken: the first records the outcome, the rest repeat it.
    answers = complete_many(stubs, reports[:256])
    assert len(set(answers)) == 1 and isinstance(answers[0], int)
