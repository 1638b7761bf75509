"""Fuzzing every RPC of a real plane with generated request messages.

Whatever a caller sends, the plane answers with a designed status: never
``INTERNAL``, ``UNKNOWN`` or a dropped call, never Python's own words, and it
keeps serving. Every ``Begin`` from an authenticated service leaves an audit
record (SI-3), and the chain verifies at the end.

The budget is fixed (``FUZZ_EXAMPLES`` per RPC) so the suite's time stays
predictable; hypothesis derandomizes under ``CI`` so a failure there
reproduces locally. A finding becomes an ``@example`` on its test.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import ORDERS_TOKEN, Plant, load_example, make_config
from tests.fuzz import hostile
from tests.fuzz.hostile import INTERNAL_WORDS
from warden.v1 import (
    approvals_pb2,
    approvals_pb2_grpc,
    audit_pb2,
    audit_pb2_grpc,
    errors_pb2,
    governor_pb2,
    governor_pb2_grpc,
    grants_pb2,
    grants_pb2_grpc,
    policy_pb2,
    policy_pb2_grpc,
    registry_pb2,
    registry_pb2_grpc,
)
from warden_server.app import serve
from warden_server.audit.chain import verify_rows
from warden_server.plane import Plane

FUZZ_EXAMPLES = int(os.environ.get("WARDEN_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)

# Statuses a hostile request may earn. INTERNAL, UNKNOWN, UNAVAILABLE,
# DEADLINE_EXCEEDED, UNIMPLEMENTED and DATA_LOSS mean the plane failed.
DESIGNED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ABORTED,
}


SERVICE_TOKEN = "x-warden-service-token"
OTHER_KEY = "not-the-plane-secret-0123456789abcdefgh"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plant]:
    """One plane for the module, with the orders example registered: the
    fuzzer's budget goes into requests, not into starting planes."""
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    server = serve(Plane.from_config(make_config(tmp)), "127.0.0.1:0")
    plant = Plant(server, tmp)
    runtime = load_example("orders").build_runtime(plant.target, ORDERS_TOKEN)
    runtime.register()
    runtime.close()
    yield plant
    server.stop(grace=0)


@pytest.fixture(scope="module")
def channel(plane: Plant) -> Iterator[grpc.Channel]:
    opened = grpc.insecure_channel(plane.target)
    yield opened
    opened.close()


def actor_tokens(plane: Plant) -> st.SearchStrategy[str]:
    """Valid tokens of every role the plane knows, and forgeries."""
    valid = [
        plane.token(roles=roles, tenant=tenant)
        for roles, tenant in [
            (("support",), "acme"),
            (("manager",), "acme"),
            (("manager",), ""),
            (("auditor",), "acme"),
            (("auditor:all",), ""),
            (("policy-author",), ""),
            (("admin",), "acme"),
        ]
    ]
    claims = {"sub": "bot-7", "roles": ["auditor:all"], "iss": "warden-test", "aud": "warden"}
    forged = [
        plane.token(ttl=-3600),
        jwt.encode({**claims, "exp": time.time() + 600}, OTHER_KEY, algorithm="HS256"),
        jwt.encode({**claims, "exp": time.time() + 600}, "", algorithm="none"),
        "a.b.c",
        "a.b",
        "e30.e30.",
        "",
    ]
    return st.one_of(st.sampled_from(valid + forged), hostile.texts)


def metadata_for(plane: Plant) -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    """Service-token and bearer metadata, present, absent or wrong."""
    service = st.sampled_from([ORDERS_TOKEN, "test-billing-token", "wrong", ""]) | (
        hostile.header_values
    )
    bearer = (actor_tokens(plane).map(lambda t: f"Bearer {t}") | hostile.header_values).filter(
        hostile.sendable
    )
    return st.tuples(st.one_of(st.none(), service), st.one_of(st.none(), bearer)).map(
        lambda pair: tuple(
            (key, value)
            for key, value in ((SERVICE_TOKEN, pair[0]), ("authorization", pair[1]))
            if value is not None
        )
    )


def check_answer(call: Callable[[], Any]) -> Any:
    """Make the call; a refusal must be designed and worded for people."""
    try:
        response = call()
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        assert code in DESIGNED, f"{code}: {details}"
        assert not any(word in details for word in INTERNAL_WORDS), details
        return None
    for word in INTERNAL_WORDS:
        assert word not in str(response), response
    return response


def plausible_input() -> st.SearchStrategy[str]:
    return hostile.json_text({"order_id": "A-1001", "amount": 120}, {"order_id": "A-1001"})


# -- Governor ---------------------------------------------------------------------


def begin_requests(plane: Plant) -> st.SearchStrategy[governor_pb2.BeginRequest]:
    return st.builds(
        governor_pb2.BeginRequest,
        invocation_id=st.one_of(st.uuids().map(str), hostile.texts),
        capability_id=hostile.capability_ids,
        capability_version=st.sampled_from(["", "1", "2", "v1"]) | hostile.texts,
        actor_token=actor_tokens(plane),
        input_json=plausible_input(),
        surface=st.sampled_from(["", "mcp", "openai", "direct"]) | hostile.texts,
        context_json=hostile.json_text({"channel": "chat"}),
        approval_id=st.sampled_from([""]) | hostile.texts,
        idempotency_key=st.sampled_from([""]) | hostile.texts,
        call_id=hostile.texts,
        attempt=hostile.uint32,
        timeout_ms=hostile.uint32,
    )


def test_begin_answers_every_request_by_design_and_records_it(
    plane: Plant, channel: grpc.Channel
) -> None:
    stub = governor_pb2_grpc.GovernorStub(channel)
    audited_before = len(plane.rows())
    authenticated = 0

    @FUZZ
    @given(request=begin_requests(plane))
    @example(request=governor_pb2.BeginRequest(capability_id="", invocation_id=str(uuid.uuid4())))
    @example(
        request=governor_pb2.BeginRequest(
            capability_id="orders.get",
            invocation_id=str(uuid.uuid4()),
            context_json=hostile.HOSTILE_JSON[0],
        )
    )
    def fuzz(request: governor_pb2.BeginRequest) -> None:
        nonlocal authenticated
        authenticated += 1
        check_answer(
            lambda: stub.Begin(request, metadata=((SERVICE_TOKEN, ORDERS_TOKEN),), timeout=30)
        )

    fuzz()
    # SI-3: every attempt of an authenticated service is on the record.
    assert wait_for(lambda: len(plane.rows()) - audited_before >= authenticated)
    assert_still_serving(plane, channel)


def test_complete_refuses_what_no_grant_backs(plane: Plant, channel: grpc.Channel) -> None:
    @FUZZ
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        stub = governor_pb2_grpc.GovernorStub(channel)
        failure = st.builds(
            errors_pb2.Failure,
            code=hostile.texts,
            stage=hostile.texts,
            public_message=hostile.texts,
            details_json=hostile.json_text({"field": "amount"}),
        )
        request = data.draw(
            st.builds(
                governor_pb2.CompleteRequest,
                invocation_id=st.one_of(st.uuids().map(str), hostile.texts),
                grant_token=actor_tokens(plane),
                status=st.integers(min_value=0, max_value=5),
                failure=st.none() | failure,
                output_json=hostile.json_text({"order_id": "A-1001"}),
                duration_ms=hostile.uint32,
            )
        )
        metadata = data.draw(metadata_for(plane))
        response = check_answer(lambda: stub.Complete(request, metadata=metadata, timeout=30))
        assert response is None, "an outcome without a grant was accepted"

    fuzz()
    assert_still_serving(plane, channel)


# -- Registry ---------------------------------------------------------------------


def definitions() -> st.SearchStrategy[registry_pb2.CapabilityDefinition]:
    schema = hostile.json_text(
        {"type": "object", "properties": {"n": {"type": "integer"}}},
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}},
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "(a)\\1"}}},
        {"$ref": "https://example.com/schema.json"},
    )
    return st.builds(
        registry_pb2.CapabilityDefinition,
        id=st.sampled_from(["orders.fuzzed", "billing.fuzzed"]) | hostile.capability_ids,
        version=st.sampled_from([""]) | hostile.texts,
        description=hostile.texts,
        input_schema_json=schema,
        output_schema_json=schema,
        side_effect=st.integers(min_value=0, max_value=6),
        timeout_ms=hostile.uint32,
        exposure=st.lists(hostile.texts, max_size=3),
        required_roles=st.lists(hostile.texts, max_size=3),
        tags=st.lists(hostile.texts, max_size=3),
    )


def test_registry_answers_every_request_by_design(plane: Plant, channel: grpc.Channel) -> None:
    # A finding: a lone surrogate in a context key was an INTERNAL error.
    surrogate_key = registry_pb2.ListCapabilitiesRequest(
        actor_token=plane.token(), context_json='{"\\ud800": 1}'
    )
    check_answer(
        lambda: registry_pb2_grpc.RegistryStub(channel).ListCapabilities(
            surrogate_key, metadata=((SERVICE_TOKEN, ORDERS_TOKEN),), timeout=30
        )
    )

    @FUZZ
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        stub = registry_pb2_grpc.RegistryStub(channel)
        metadata = data.draw(metadata_for(plane))
        tokens = actor_tokens(plane)
        context = hostile.json_text({"channel": "chat"})
        surface = st.sampled_from(["", "mcp"]) | hostile.texts
        request: Message
        match data.draw(st.sampled_from(["register", "list", "get"])):
            case "register":
                request = registry_pb2.RegisterRequest(
                    capabilities=data.draw(st.lists(definitions(), max_size=3))
                )
                check_answer(lambda: stub.Register(request, metadata=metadata, timeout=30))
            case "list":
                request = registry_pb2.ListCapabilitiesRequest(
                    actor_token=data.draw(tokens),
                    surface=data.draw(surface),
                    context_json=data.draw(context),
                )
                check_answer(lambda: stub.ListCapabilities(request, metadata=metadata, timeout=30))
            case _:
                request = registry_pb2.GetCapabilityRequest(
                    id=data.draw(hostile.capability_ids),
                    version=data.draw(hostile.texts),
                    actor_token=data.draw(tokens),
                    surface=data.draw(surface),
                    context_json=data.draw(context),
                )
                check_answer(lambda: stub.GetCapability(request, metadata=metadata, timeout=30))

    fuzz()
    assert_still_serving(plane, channel)


# -- Audit ------------------------------------------------------------------------


def audit_filters() -> st.SearchStrategy[audit_pb2.AuditFilter]:
    return st.builds(
        audit_pb2.AuditFilter,
        since=hostile.durations,
        until=hostile.durations,
        capabilities=st.lists(hostile.texts, max_size=3),
        actor=hostile.texts,
        tenant=hostile.texts,
        stage=hostile.texts,
        code=hostile.texts,
        status=hostile.texts,
        kind=hostile.texts,
        invocation_id=hostile.texts,
        seq=st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1),
    )


def test_audit_answers_every_request_by_design(plane: Plant, channel: grpc.Channel) -> None:
    @FUZZ
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        stub = audit_pb2_grpc.AuditStub(channel)
        metadata = data.draw(metadata_for(plane))
        match data.draw(st.sampled_from(["query", "stats", "export", "verify"])):
            case "query":
                query = audit_pb2.QueryRequest(
                    filter=data.draw(audit_filters()),
                    limit=data.draw(hostile.uint32),
                    page_token=data.draw(hostile.page_tokens),
                )
                check_answer(lambda: stub.Query(query, metadata=metadata, timeout=30))
            case "stats":
                stats = audit_pb2.StatsRequest(
                    filter=data.draw(audit_filters()),
                    by=data.draw(st.sampled_from(["stage", "code", "capability"]) | hostile.texts),
                )
                check_answer(lambda: stub.Stats(stats, metadata=metadata, timeout=30))
            case "export":
                export = audit_pb2.ExportRequest(filter=data.draw(audit_filters()))
                check_answer(lambda: list(stub.Export(export, metadata=metadata, timeout=30)))
            case _:
                check_answer(
                    lambda: stub.Verify(audit_pb2.VerifyRequest(), metadata=metadata, timeout=30)
                )

    fuzz()
    assert_still_serving(plane, channel)


# -- Approvals, policy status, grant keys --------------------------------------------


def test_admin_rpcs_answer_every_request_by_design(plane: Plant, channel: grpc.Channel) -> None:
    @FUZZ
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        approvals = approvals_pb2_grpc.ApprovalsStub(channel)
        policy = policy_pb2_grpc.PoliciesStub(channel)
        grants = grants_pb2_grpc.GrantKeysStub(channel)
        metadata = data.draw(metadata_for(plane))
        ids = st.uuids().map(str) | hostile.texts
        match data.draw(
            st.sampled_from(["list", "get", "approve", "deny", "status", "caps", "keys"])
        ):
            case "list":
                listing = approvals_pb2.ListApprovalsRequest(
                    states=data.draw(st.lists(st.integers(min_value=0, max_value=9), max_size=3)),
                    limit=data.draw(hostile.uint32),
                )
                check_answer(
                    lambda: approvals.ListApprovals(listing, metadata=metadata, timeout=30)
                )
            case "get":
                get = approvals_pb2.GetApprovalRequest(id=data.draw(ids))
                check_answer(lambda: approvals.GetApproval(get, metadata=metadata, timeout=30))
            case "approve":
                approve = approvals_pb2.ApproveRequest(
                    id=data.draw(ids), reason=data.draw(hostile.texts)
                )
                check_answer(lambda: approvals.Approve(approve, metadata=metadata, timeout=30))
            case "deny":
                deny = approvals_pb2.DenyRequest(id=data.draw(ids), reason=data.draw(hostile.texts))
                check_answer(lambda: approvals.Deny(deny, metadata=metadata, timeout=30))
            case "status":
                status = policy_pb2.PolicyStatusRequest(actor_token=data.draw(actor_tokens(plane)))
                check_answer(lambda: policy.GetStatus(status, metadata=metadata, timeout=30))
            case "caps":
                caps = policy_pb2.PolicyCapabilitiesRequest(
                    actor_token=data.draw(actor_tokens(plane))
                )
                check_answer(lambda: policy.ListCapabilities(caps, metadata=metadata, timeout=30))
            case _:
                keys = grants_pb2.ListGrantKeysRequest()
                check_answer(lambda: grants.ListGrantKeys(keys, metadata=metadata, timeout=30))

    fuzz()
    assert_still_serving(plane, channel)


# -- after each storm ----------------------------------------------------------------


def assert_still_serving(plane: Plant, channel: grpc.Channel) -> None:
    """Whatever the fuzzer sent, a well-formed call still works and the
    chain is intact."""
    stub = governor_pb2_grpc.GovernorStub(channel)
    response = stub.Begin(
        governor_pb2.BeginRequest(
            invocation_id=str(uuid.uuid4()),
            capability_id="orders.get",
            actor_token=plane.token(),
            input_json='{"order_id": "A-1001"}',
            surface="direct",
        ),
        metadata=((SERVICE_TOKEN, ORDERS_TOKEN),),
        timeout=30,
    )
    assert response.WhichOneof("outcome") == "grant", response
    result = verify_rows(plane.rows())
    assert result.ok, result


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()
