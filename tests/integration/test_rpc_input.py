"""Bad input on every RPC, sent with raw gRPC stubs to a real plane.

Each refusal must carry the exact gRPC status and a message that names the
problem; governed failures (bad arguments, unknown capabilities, bad actor
tokens) come back as a normal BeginResponse with a failure. After every bad
call the audit chain still verifies, and refused Begins are audited (SI-3).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import warden
from tests.conftest import BILLING_TOKEN, ORDERS_TOKEN, Plant
from tests.integration.lab import Lab, build_lab, write_lab_policies
from warden.v1 import (
    errors_pb2,
    governor_pb2,
    governor_pb2_grpc,
    registry_pb2,
    registry_pb2_grpc,
)
from warden_server.audit.chain import verify_rows

TOKEN_KEY = "x-warden-service-token"
Metadata = tuple[tuple[str, str], ...]
ORDERS: Metadata = ((TOKEN_KEY, ORDERS_TOKEN),)
BILLING: Metadata = ((TOKEN_KEY, BILLING_TOKEN),)
NO_TOKEN: Metadata = ()
WRONG_TOKEN: Metadata = ((TOKEN_KEY, "not-a-configured-token"),)
MISSING_TOKEN_MESSAGE = "missing service token (metadata 'x-warden-service-token')"
UNKNOWN_TOKEN_MESSAGE = "unknown service token"
SCHEMA = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}})


# -- helpers -------------------------------------------------------------------


class Stubs:
    def __init__(self, channel: grpc.Channel) -> None:
        self.governor = governor_pb2_grpc.GovernorStub(channel)
        self.registry = registry_pb2_grpc.RegistryStub(channel)


@contextmanager
def open_stubs(plant: Plant) -> Iterator[Stubs]:
    channel = grpc.insecure_channel(plant.target)
    try:
        yield Stubs(channel)
    finally:
        channel.close()


@pytest.fixture
def stubs(plant: Plant) -> Iterator[Stubs]:
    with open_stubs(plant) as opened:
        yield opened


@pytest.fixture
def lab_stubs(lab_plant: Plant, lab_rt: warden.Runtime) -> Iterator[Stubs]:
    """Stubs to the lab plane, with the lab capabilities (orders.echo, ...) registered."""
    with open_stubs(lab_plant) as opened:
        yield opened


def refused(call: Callable[..., Any], request: Any, metadata: Metadata) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call(request, metadata=metadata, timeout=10)
    return raised.value


def assert_refused(
    call: Callable[..., Any],
    request: Any,
    metadata: Metadata,
    code: grpc.StatusCode,
    details: str,
) -> None:
    """The call fails with exactly this status, and its message contains ``details``."""
    error = refused(call, request, metadata)
    assert error.code() == code, error.details()
    assert details in (error.details() or ""), error.details()


def assert_chain_intact(plant: Plant) -> None:
    rows = plant.rows()
    result = verify_rows(rows)
    assert result.ok, f"audit chain broken at seq {result.first_bad_seq}: {result.problem}"
    assert result.checked == len(rows)


def definition(**fields: Any) -> registry_pb2.CapabilityDefinition:
    values: dict[str, Any] = {
        "id": "orders.probe",
        "description": "A probe.",
        "input_schema_json": SCHEMA,
        "output_schema_json": SCHEMA,
        "side_effect": registry_pb2.SIDE_EFFECT_READ,
        **fields,
    }
    return registry_pb2.CapabilityDefinition(**values)


def begin_request(plant: Plant, **fields: Any) -> governor_pb2.BeginRequest:
    values: dict[str, Any] = {
        "invocation_id": str(uuid.uuid4()),
        "capability_id": "orders.echo",
        "actor_token": plant.token(),
        "input_json": '{"n": 1}',
        **fields,
    }
    return governor_pb2.BeginRequest(**values)


def begin_grant(stubs: Stubs, plant: Plant) -> tuple[str, str]:
    """A granted invocation's id and grant token."""
    request = begin_request(plant)
    response = stubs.governor.Begin(request, metadata=ORDERS, timeout=10)
    assert response.WhichOneof("outcome") == "grant", response
    return request.invocation_id, response.grant.token


def forge_actor_token(plant: Plant) -> str:
    claims = jwt.decode(plant.token(), options={"verify_signature": False})
    return jwt.encode(claims, "another-secret-of-sufficient-length-123", algorithm="HS256")


def invocation_state(plant: Plant, invocation_id: str) -> str:
    (row,) = plant.rows("SELECT state FROM invocations WHERE invocation_id = ?", (invocation_id,))
    return str(row["state"])


# -- every RPC refuses callers without a valid service token ---------------------


RPCS: list[tuple[str, Callable[[Stubs], Callable[..., Any]], Any]] = [
    (
        "Register",
        lambda s: s.registry.Register,
        registry_pb2.RegisterRequest(capabilities=[definition()]),
    ),
    (
        "ListCapabilities",
        lambda s: s.registry.ListCapabilities,
        registry_pb2.ListCapabilitiesRequest(),
    ),
    (
        "GetCapability",
        lambda s: s.registry.GetCapability,
        registry_pb2.GetCapabilityRequest(id="orders.echo"),
    ),
    (
        "Begin",
        lambda s: s.governor.Begin,
        governor_pb2.BeginRequest(
            invocation_id=str(uuid.uuid4()), capability_id="orders.echo", input_json="{}"
        ),
    ),
    (
        "Complete",
        lambda s: s.governor.Complete,
        governor_pb2.CompleteRequest(
            invocation_id=str(uuid.uuid4()),
            grant_token="x",
            status=governor_pb2.OUTCOME_STATUS_SUCCEEDED,
        ),
    ),
    (
        "CompleteMany",
        lambda s: s.governor.CompleteMany,
        governor_pb2.CompleteManyRequest(
            reports=[
                governor_pb2.OutcomeReport(
                    request=governor_pb2.CompleteRequest(
                        invocation_id=str(uuid.uuid4()),
                        grant_token="x",
                        status=governor_pb2.OUTCOME_STATUS_SUCCEEDED,
                    )
                )
            ]
        ),
    ),
]


@pytest.mark.parametrize(
    ("metadata", "message"),
    [(NO_TOKEN, MISSING_TOKEN_MESSAGE), (WRONG_TOKEN, UNKNOWN_TOKEN_MESSAGE)],
    ids=["missing", "wrong"],
)
@pytest.mark.parametrize(
    ("method", "request_"), [pytest.param(*rest, id=name) for name, *rest in RPCS]
)
def test_every_rpc_requires_a_valid_service_token(
    plant: Plant,
    stubs: Stubs,
    method: Callable[[Stubs], Callable[..., Any]],
    request_: Any,
    metadata: Metadata,
    message: str,
) -> None:
    error = refused(method(stubs), request_, metadata)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error.details() == message
    assert plant.rows("SELECT * FROM capabilities") == []
    assert plant.rows("SELECT * FROM invocations") == []
    assert_chain_intact(plant)


# -- Register ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capabilities", "message"),
    [
        ([], "no capabilities to register"),
        ([definition(id="")], "<no id>: id must be namespace.name"),
        ([definition(id="Orders.Refund")], "Orders.Refund: id must be namespace.name"),
        ([definition(id="orders")], "orders: id must be namespace.name"),
        ([definition(id="orders.refund-all")], "orders.refund-all: id must be namespace.name"),
        (
            [definition(input_schema_json="{not json")],
            "orders.probe: input_schema_json is not valid JSON",
        ),
        (
            [definition(output_schema_json="[1, 2]")],
            "orders.probe: output_schema_json must be a JSON object",
        ),
        (
            [definition(input_schema_json='{"type": "banana"}')],
            "orders.probe: input_schema: invalid JSON Schema at /type",
        ),
        (
            [definition(output_schema_json='{"properties": {"n": {"minimum": "ten"}}}')],
            "orders.probe: output_schema: invalid JSON Schema at /properties/n/minimum",
        ),
        (
            [definition(side_effect=registry_pb2.SIDE_EFFECT_UNSPECIFIED)],
            "orders.probe: side_effect is required (read, write or idempotent)",
        ),
        (
            [definition(exposure=["mcp", "fax"])],
            "orders.probe: unknown surfaces ['fax'] (known: mcp, openai, direct)",
        ),
        (
            [definition(errors=[registry_pb2.DeclaredError(code="FORBIDDEN", message="No.")])],
            "orders.probe: declared error FORBIDDEN shadows a built-in code",
        ),
        (
            [definition(errors=[registry_pb2.DeclaredError(code="not_upper", message="No.")])],
            "orders.probe: declared error 'not_upper' must be UPPER_SNAKE_CASE",
        ),
        (
            [definition(errors=[registry_pb2.DeclaredError(code="NOT_ELIGIBLE", message=" ")])],
            "orders.probe: declared error NOT_ELIGIBLE needs a message",
        ),
        (
            [definition(version="1 2")],
            "orders.probe: version '1 2' must be 1-64 of [A-Za-z0-9._-]",
        ),
        ([definition(), definition()], "orders.probe: listed twice"),
    ],
    ids=[
        "empty-list",
        "missing-id",
        "uppercase-id",
        "id-without-name",
        "id-with-dash",
        "schema-not-json",
        "schema-not-object",
        "input-schema-not-json-schema",
        "output-schema-not-json-schema",
        "missing-side-effect",
        "unknown-surface",
        "error-shadows-built-in",
        "error-code-not-upper-snake",
        "error-without-message",
        "bad-version",
        "listed-twice",
    ],
)
def test_register_refuses_malformed_definitions(
    plant: Plant,
    stubs: Stubs,
    capabilities: list[registry_pb2.CapabilityDefinition],
    message: str,
) -> None:
    request = registry_pb2.RegisterRequest(capabilities=capabilities)
    assert_refused(
        stubs.registry.Register, request, ORDERS, grpc.StatusCode.INVALID_ARGUMENT, message
    )
    assert plant.rows("SELECT * FROM capabilities") == []
    assert plant.events(kind="registry") == []
    assert_chain_intact(plant)


@pytest.mark.parametrize(
    "schema",
    [
        '{"type": "object", "properties": {"n": {"const": 1180591620717411303424}}}',
        '{"type": "object", "properties": {"n": {"maximum": NaN}}}',
        '{"$ref": "#/$defs/missing"}',
        '{"$ref": "https://schemas.example.com/order.json"}',
    ],
    ids=["integer-beyond-2-53", "nan", "dangling-local-ref", "remote-ref"],
)
def test_register_refuses_a_schema_the_plane_cannot_use(
    plant: Plant, stubs: Stubs, schema: str
) -> None:
    """A schema must be digestible (RFC 8785) and self-contained; otherwise
    Register says which schema is wrong instead of failing internally, or
    accepting a capability whose every Begin then fails."""
    request = registry_pb2.RegisterRequest(capabilities=[definition(input_schema_json=schema)])
    assert_refused(
        stubs.registry.Register,
        request,
        ORDERS,
        grpc.StatusCode.INVALID_ARGUMENT,
        "orders.probe: input_schema",
    )
    assert plant.rows("SELECT * FROM capabilities") == []
    assert_chain_intact(plant)


def test_register_lists_every_problem_at_once(stubs: Stubs) -> None:
    request = registry_pb2.RegisterRequest(
        capabilities=[
            definition(id="orders.one", exposure=["fax"]),
            definition(id="orders.two", input_schema_json='{"type": 7}'),
        ]
    )
    error = refused(stubs.registry.Register, request, ORDERS)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = error.details() or ""
    assert "orders.one: unknown surfaces ['fax']" in details
    assert "orders.two: input_schema: invalid JSON Schema at /type" in details


def test_register_is_all_or_nothing(plant: Plant, stubs: Stubs) -> None:
    request = registry_pb2.RegisterRequest(
        capabilities=[definition(id="orders.good"), definition(id="orders.bad", exposure=["fax"])]
    )
    assert_refused(
        stubs.registry.Register, request, ORDERS, grpc.StatusCode.INVALID_ARGUMENT, "orders.bad"
    )
    assert plant.rows("SELECT * FROM capabilities") == []
    assert plant.events(kind="registry") == []


@pytest.mark.parametrize(
    ("metadata", "capability_id", "message"),
    [
        (
            ORDERS,
            "billing.charge",
            "service 'orders' does not own the namespace of billing.charge (it owns: orders)",
        ),
        (
            ORDERS,
            "ordersx.refund",
            "service 'orders' does not own the namespace of ordersx.refund (it owns: orders)",
        ),
        (
            BILLING,
            "orders.refund",
            "service 'billing' does not own the namespace of orders.refund (it owns: billing)",
        ),
    ],
    ids=["other-namespace", "namespace-prefix", "billing-into-orders"],
)
def test_register_refuses_a_namespace_the_service_does_not_own(
    plant: Plant, stubs: Stubs, metadata: Metadata, capability_id: str, message: str
) -> None:
    request = registry_pb2.RegisterRequest(capabilities=[definition(id=capability_id)])
    assert_refused(
        stubs.registry.Register, request, metadata, grpc.StatusCode.PERMISSION_DENIED, message
    )
    assert plant.rows("SELECT * FROM capabilities") == []
    assert_chain_intact(plant)


def test_register_accepts_a_well_formed_definition(plant: Plant, stubs: Stubs) -> None:
    """The baseline the refusals above are measured against."""
    request = registry_pb2.RegisterRequest(capabilities=[definition()])
    response = stubs.registry.Register(request, metadata=ORDERS, timeout=10)
    (capability,) = response.capabilities
    assert capability.definition.id == "orders.probe"
    assert capability.definition.version == "1"
    assert capability.service == "orders"
    assert_chain_intact(plant)


# -- ListCapabilities and GetCapability -----------------------------------------------


@pytest.mark.parametrize(
    ("fields", "code", "message"),
    [
        ({"actor_token": ""}, grpc.StatusCode.UNAUTHENTICATED, "no actor token"),
        ({"actor_token": "not-a-jwt"}, grpc.StatusCode.UNAUTHENTICATED, "actor token rejected"),
        (
            {"surface": "fax"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown surface 'fax' (known: mcp, openai, direct)",
        ),
        (
            {"context_json": "{oops"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "context_json is not valid JSON",
        ),
        (
            {"context_json": "[1]"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "context_json must be a JSON object",
        ),
    ],
    ids=["no-actor", "garbage-actor", "unknown-surface", "context-not-json", "context-not-object"],
)
def test_list_and_get_capability_refuse_bad_input(
    lab_plant: Plant,
    lab_stubs: Stubs,
    fields: dict[str, Any],
    code: grpc.StatusCode,
    message: str,
) -> None:
    values = {"actor_token": lab_plant.token(), **fields}
    assert_refused(
        lab_stubs.registry.ListCapabilities,
        registry_pb2.ListCapabilitiesRequest(**values),
        ORDERS,
        code,
        message,
    )
    assert_refused(
        lab_stubs.registry.GetCapability,
        registry_pb2.GetCapabilityRequest(id="orders.echo", **values),
        ORDERS,
        code,
        message,
    )
    assert_chain_intact(lab_plant)


def test_list_and_get_refuse_expired_and_forged_actor_tokens(
    lab_plant: Plant, lab_stubs: Stubs
) -> None:
    for token, message in [
        (lab_plant.token(ttl=-120), "actor token expired"),
        (forge_actor_token(lab_plant), "actor token signature is invalid"),
    ]:
        assert_refused(
            lab_stubs.registry.ListCapabilities,
            registry_pb2.ListCapabilitiesRequest(actor_token=token),
            ORDERS,
            grpc.StatusCode.UNAUTHENTICATED,
            message,
        )
        assert_refused(
            lab_stubs.registry.GetCapability,
            registry_pb2.GetCapabilityRequest(id="orders.echo", actor_token=token),
            ORDERS,
            grpc.StatusCode.UNAUTHENTICATED,
            message,
        )


def test_get_capability_unknown_id_and_version_are_not_found(
    lab_plant: Plant, lab_stubs: Stubs
) -> None:
    for request in [
        registry_pb2.GetCapabilityRequest(id="orders.nope", actor_token=lab_plant.token()),
        registry_pb2.GetCapabilityRequest(
            id="orders.echo", version="99", actor_token=lab_plant.token()
        ),
    ]:
        error = refused(lab_stubs.registry.GetCapability, request, ORDERS)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert error.details() == "Capability not found."


@pytest.mark.parametrize("capability_id", ["", "orders." + "x" * 300], ids=["empty", "too-long"])
def test_get_capability_with_an_id_that_cannot_name_one_is_not_found(
    lab_plant: Plant, lab_stubs: Stubs, capability_id: str
) -> None:
    """An id that cannot name a capability is an unknown capability, as Begin
    answers it (SI-8), not a malformed request."""
    request = registry_pb2.GetCapabilityRequest(id=capability_id, actor_token=lab_plant.token())
    error = refused(lab_stubs.registry.GetCapability, request, ORDERS)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "Capability not found."


# -- Begin: refusals (gRPC errors, each audited as 'rejected') -------------------------


BEGIN_REFUSALS: list[tuple[str, Metadata, dict[str, Any], grpc.StatusCode, str]] = [
    ("missing-service-token", NO_TOKEN, {}, grpc.StatusCode.UNAUTHENTICATED, MISSING_TOKEN_MESSAGE),
    ("wrong-service-token", WRONG_TOKEN, {}, grpc.StatusCode.UNAUTHENTICATED, "unknown service"),
    (
        "invocation-id-not-uuid",
        ORDERS,
        {"invocation_id": "call-1"},
        grpc.StatusCode.INVALID_ARGUMENT,
        "invocation_id must be a UUID",
    ),
    (
        "missing-invocation-id",
        ORDERS,
        {"invocation_id": ""},
        grpc.StatusCode.INVALID_ARGUMENT,
        "invocation_id must be a UUID",
    ),
    (
        "unknown-surface",
        ORDERS,
        {"surface": "fax"},
        grpc.StatusCode.INVALID_ARGUMENT,
        "unknown surface 'fax' (known: mcp, openai, direct)",
    ),
    (
        "context-not-json",
        ORDERS,
        {"context_json": "{channel: chat}"},
        grpc.StatusCode.INVALID_ARGUMENT,
        "context_json is not valid JSON",
    ),
    (
        "context-not-object",
        ORDERS,
        {"context_json": '"chat"'},
        grpc.StatusCode.INVALID_ARGUMENT,
        "context_json must be a JSON object",
    ),
]


@pytest.mark.parametrize(
    ("metadata", "fields", "code", "message"),
    [pytest.param(*rest, id=name) for name, *rest in BEGIN_REFUSALS],
)
def test_begin_refuses_malformed_requests(
    lab_plant: Plant,
    lab_stubs: Stubs,
    lab: Lab,
    metadata: Metadata,
    fields: dict[str, Any],
    code: grpc.StatusCode,
    message: str,
) -> None:
    request = begin_request(lab_plant, **fields)
    assert_refused(lab_stubs.governor.Begin, request, metadata, code, message)
    (row,) = lab_plant.events(kind="decision")
    assert row["status"] == "rejected"
    assert message in row["reason"]
    assert lab_plant.rows("SELECT * FROM invocations") == []
    assert lab.count("echo") == 0
    assert_chain_intact(lab_plant)


def test_begin_refuses_a_reused_invocation_id(lab_plant: Plant, lab_stubs: Stubs) -> None:
    invocation_id, _ = begin_grant(lab_stubs, lab_plant)
    again = begin_request(lab_plant, invocation_id=invocation_id)
    assert_refused(
        lab_stubs.governor.Begin,
        again,
        ORDERS,
        grpc.StatusCode.INVALID_ARGUMENT,
        f"invocation_id {invocation_id} was already used",
    )
    statuses = [r["status"] for r in lab_plant.events(invocation_id=invocation_id)]
    assert statuses == ["granted", "rejected"]
    assert invocation_state(lab_plant, invocation_id) == "granted"
    assert_chain_intact(lab_plant)


def test_begin_refuses_an_invocation_id_reused_after_a_failed_decision(
    lab_plant: Plant, lab_stubs: Stubs
) -> None:
    """An invocation id names one attempt: reusing the id of a denied call must
    not produce a second decision for the same invocation."""
    first = begin_request(lab_plant, input_json='{"n": 101}')
    response = lab_stubs.governor.Begin(first, metadata=ORDERS, timeout=10)
    assert response.failure.code == "POLICY_DENIED"
    again = begin_request(lab_plant, invocation_id=first.invocation_id)
    assert_refused(
        lab_stubs.governor.Begin,
        again,
        ORDERS,
        grpc.StatusCode.INVALID_ARGUMENT,
        f"invocation_id {first.invocation_id} was already used",
    )
    assert lab_plant.rows("SELECT * FROM invocations") == []


def test_si3_a_flood_of_unauthenticated_begins_is_on_the_record_without_a_write_each(
    lab_plant: Plant, lab_stubs: Stubs
) -> None:
    """Begins without a valid service token are all accounted for (SI-3), but
    cost no fsync each: the first of a window is recorded, the rest counted
    into one summary; none spends the invocation id it names."""
    flood = [begin_request(lab_plant) for _ in range(200)]
    for request in flood:
        refused(lab_stubs.governor.Begin, request, WRONG_TOKEN)
    processes = lab_plant.config.process_count
    assert len(lab_plant.events(kind="decision", status="rejected")) <= processes
    lab_plant.server.stop()
    rejected = lab_plant.events(kind="decision", status="rejected")
    assert len(rejected) <= 2 * processes
    accounted = sum(
        json.loads(r["input"])["refused"] if r["reason"].startswith("begin.refused") else 1
        for r in rejected
    )
    assert accounted == len(flood)
    assert lab_plant.rows("SELECT * FROM decided_invocations") == []


def test_si3_malformed_and_unauthenticated_begins_are_audited(
    lab_plant: Plant, lab_stubs: Stubs, lab: Lab
) -> None:
    """Every attempt leaves a record: refused requests as 'rejected' decisions
    (naming the service when it is known), governed failures as 'failed' ones."""
    refusals = [
        (NO_TOKEN, begin_request(lab_plant), None),
        (WRONG_TOKEN, begin_request(lab_plant), None),
        (ORDERS, begin_request(lab_plant, invocation_id="nope"), "orders"),
        (ORDERS, begin_request(lab_plant, context_json='{"a":' * 10_000), "orders"),
        (ORDERS, begin_request(lab_plant, surface="fax"), "orders"),
        (ORDERS, begin_request(lab_plant, context_json="[]"), "orders"),
    ]
    for metadata, request, _ in refusals:
        refused(lab_stubs.governor.Begin, request, metadata)
    rejected = lab_plant.events(kind="decision", status="rejected")
    assert len(rejected) == len(refusals)
    for row, (_, request, service) in zip(rejected, refusals, strict=True):
        assert row["service"] == service
        assert row["capability_id"] == (request.capability_id or None)
        assert row["reason"] and row["policy_revision"]
    assert rejected[0]["reason"].startswith("ServiceAuthenticationError: missing service token")
    assert rejected[1]["reason"] == "ServiceAuthenticationError: unknown service token"
    assert rejected[2]["invocation_id"] == "nope"

    failures = [
        begin_request(lab_plant, input_json="{not json"),
        begin_request(lab_plant, capability_id=""),
        begin_request(lab_plant, actor_token=""),
        begin_request(lab_plant, actor_token=lab_plant.token(ttl=-120)),
        begin_request(lab_plant, actor_token=forge_actor_token(lab_plant)),
    ]
    for request in failures:
        response = lab_stubs.governor.Begin(request, metadata=ORDERS, timeout=10)
        assert response.WhichOneof("outcome") == "failure"
        (row,) = lab_plant.events(invocation_id=request.invocation_id)
        assert (row["kind"], row["status"]) == ("decision", "failed")
        assert row["code"] == response.failure.code
    assert lab.count("echo") == 0
    assert lab_plant.rows("SELECT * FROM invocations") == []
    assert_chain_intact(lab_plant)


# -- Begin: governed failures (a BeginResponse carrying a failure) ----------------------

BAD_ACTORS: dict[str, Callable[[Plant], str]] = {
    "expired": lambda plant: plant.token(ttl=-120),
    "forged": forge_actor_token,
}


@pytest.mark.parametrize(
    ("fields", "code", "stage", "message", "reason"),
    [
        (
            {"input_json": "{not json"},
            "INPUT_INVALID",
            "adapter",
            None,
            "input-not-json",
        ),
        ({"input_json": ""}, "INPUT_INVALID", "adapter", None, "input-not-json"),
        (
            {"input_json": '{"n": "seven"}'},
            "INPUT_INVALID",
            "input-validation",
            None,
            "schema-violation",
        ),
        (
            {"capability_id": "orders.nope"},
            "CAPABILITY_NOT_FOUND",
            "discovery",
            "Capability not found.",
            "unknown-capability",
        ),
        (
            {"capability_id": "orders.echo", "capability_version": "99"},
            "CAPABILITY_NOT_FOUND",
            "discovery",
            "Capability not found.",
            "unknown-version",
        ),
        (
            {"capability_id": ""},
            "CAPABILITY_NOT_FOUND",
            "discovery",
            "Capability not found.",
            "malformed-capability-id",
        ),
        (
            {"capability_id": "orders." + "x" * 300},
            "CAPABILITY_NOT_FOUND",
            "discovery",
            "Capability not found.",
            "malformed-capability-id",
        ),
        (
            {"actor_token": ""},
            "UNAUTHENTICATED",
            "authentication",
            "Authentication is required.",
            "no actor token",
        ),
        (
            {"actor_token": "expired"},
            "UNAUTHENTICATED",
            "authentication",
            "Authentication is required.",
            "actor token expired",
        ),
        (
            {"actor_token": "forged"},
            "UNAUTHENTICATED",
            "authentication",
            "Authentication is required.",
            "actor token signature is invalid",
        ),
    ],
    ids=[
        "input-not-json",
        "input-empty",
        "input-wrong-type",
        "unknown-capability",
        "unknown-version",
        "empty-capability-id",
        "capability-id-too-long",
        "no-actor",
        "expired-actor",
        "forged-actor",
    ],
)
def test_begin_answers_governed_failures_as_a_failure(
    lab_plant: Plant,
    lab_stubs: Stubs,
    lab: Lab,
    fields: dict[str, Any],
    code: str,
    stage: str,
    message: str | None,
    reason: str,
) -> None:
    if fields.get("actor_token") in BAD_ACTORS:
        fields = {**fields, "actor_token": BAD_ACTORS[fields["actor_token"]](lab_plant)}
    request = begin_request(lab_plant, **fields)
    response = lab_stubs.governor.Begin(request, metadata=ORDERS, timeout=10)
    assert response.WhichOneof("outcome") == "failure"
    assert response.invocation_id == request.invocation_id
    failure: errors_pb2.Failure = response.failure
    assert (failure.code, failure.stage) == (code, stage)
    assert failure.exposed and not failure.retryable
    if message is not None:
        assert failure.public_message == message
    (row,) = lab_plant.events(invocation_id=request.invocation_id)
    assert (row["kind"], row["status"], row["code"], row["stage"]) == (
        "decision",
        "failed",
        code,
        stage,
    )
    assert reason in row["reason"]
    assert lab_plant.rows("SELECT * FROM invocations") == []
    assert lab.count("echo") == 0
    assert_chain_intact(lab_plant)


def test_begin_unparsable_input_details_never_echo_the_input(
    lab_plant: Plant, lab_stubs: Stubs
) -> None:
    request = begin_request(lab_plant, input_json='{"n": 1, secret-token-123')
    response = lab_stubs.governor.Begin(request, metadata=ORDERS, timeout=10)
    assert json.loads(response.failure.details_json) == {
        "issues": [{"path": "", "message": "must be a JSON document"}]
    }
    assert "secret-token-123" not in str(response)
    (row,) = lab_plant.events(invocation_id=request.invocation_id)
    assert row["input"] is None


@pytest.mark.parametrize(
    "input_json",
    [
        '{"n": 1, "x": NaN}',
        '{"n": 1, "x": Infinity}',
        '{"n": 1, "x": -Infinity}',
        '{"n": 1, "note": "\\ud800"}',
        '{"n": 1152921504606846976}',
    ],
    ids=["nan", "infinity", "minus-infinity", "lone-surrogate", "integer-beyond-2-53"],
)
def test_begin_answers_input_that_has_no_canonical_json_form_as_input_invalid(
    lab_plant: Plant, lab_stubs: Stubs, lab: Lab, input_json: str
) -> None:
    """The input digest is RFC 8785 canonical JSON, which has no NaN, no
    Infinity, no lone surrogates and no integers beyond 2**53: such input is
    a governed INPUT_INVALID failure, audited like any other, never an
    internal error."""
    request = begin_request(lab_plant, input_json=input_json)
    response = lab_stubs.governor.Begin(request, metadata=ORDERS, timeout=10)
    assert response.WhichOneof("outcome") == "failure"
    assert response.failure.code == "INPUT_INVALID"
    (row,) = lab_plant.events(invocation_id=request.invocation_id)
    assert (row["status"], row["code"]) == ("failed", "INPUT_INVALID")
    assert lab.count("echo") == 0
    assert_chain_intact(lab_plant)


def test_begin_refuses_input_over_the_size_limit(
    start_plane: Callable[..., Plant], tmp_path: Path, lab: Lab
) -> None:
    plant = start_plane(write_lab_policies(tmp_path / "small-lab"), max_input_bytes=1000)
    rt = build_lab(plant.target, ORDERS_TOKEN, lab)
    try:
        rt.register()
    finally:
        rt.close()
    with open_stubs(plant) as stubs:
        fits = begin_request(plant, input_json=json.dumps({"n": 1, "note": "x" * 900}))
        assert stubs.governor.Begin(fits, metadata=ORDERS, timeout=10).HasField("grant")
        big = begin_request(plant, input_json=json.dumps({"n": 1, "note": "x" * 1000}))
        response = stubs.governor.Begin(big, metadata=ORDERS, timeout=10)
    failure = response.failure
    assert (failure.code, failure.stage) == ("INPUT_INVALID", "input-validation")
    assert json.loads(failure.details_json) == {
        "issues": [{"path": "", "message": "must be at most 1000 bytes of JSON"}]
    }
    (row,) = plant.events(invocation_id=big.invocation_id)
    assert (row["status"], row["code"], row["reason"]) == (
        "failed",
        "INPUT_INVALID",
        "input-too-large",
    )
    assert row["input"] is None
    assert lab.count("echo") == 0
    assert_chain_intact(plant)


def test_an_input_larger_than_the_plane_reads_is_invalid_input_not_an_outage(
    start_plane: Callable[..., Plant], tmp_path: Path, lab: Lab
) -> None:
    """gRPC refuses a request beyond the plane's receive limit (its input
    limit and a megabyte) before the plane reads it: the SDK answers the
    model INPUT_INVALID, which it can act on, not GOVERNANCE_UNAVAILABLE."""
    plant = start_plane(write_lab_policies(tmp_path / "small-lab"), max_input_bytes=1000)
    rt = build_lab(plant.target, ORDERS_TOKEN, lab)
    huge = {"n": 1, "note": "x" * (2 * 1024 * 1024)}
    try:
        blocking = rt.invoke("orders.echo", huge, actor=plant.token())
        awaited = asyncio.run(rt.ainvoke("orders.echo", huge, actor=plant.token()))
    finally:
        rt.close()
    for envelope in (blocking, awaited):
        assert envelope.error is not None
        assert envelope.error.to_model() == {
            "code": "INPUT_INVALID",
            "message": envelope.error.public_message,
            "retryable": False,
            "details": {"issues": [{"path": "", "message": "is larger than the plane reads"}]},
        }
        assert "RESOURCE_EXHAUSTED" in str(envelope.error.cause)
    assert lab.count("echo") == 0


# -- Complete ----------------------------------------------------------------------------


def complete_request(
    invocation_id: str, grant_token: str, **fields: Any
) -> governor_pb2.CompleteRequest:
    values: dict[str, Any] = {
        "invocation_id": invocation_id,
        "grant_token": grant_token,
        "status": governor_pb2.OUTCOME_STATUS_SUCCEEDED,
        "output_json": '{"n": 1, "note": ""}',
        **fields,
    }
    return governor_pb2.CompleteRequest(**values)


def forge_grant(token: str) -> str:
    """The same claims and header, signed with an Ed25519 key the plane never saw."""
    claims = jwt.decode(token, options={"verify_signature": False})
    header = jwt.get_unverified_header(token)
    return jwt.encode(
        claims, Ed25519PrivateKey.generate(), algorithm="EdDSA", headers={"kid": header["kid"]}
    )


def failed_outcome(stage: str = "execution", code: str = "NOT_ELIGIBLE") -> errors_pb2.Failure:
    return errors_pb2.Failure(code=code, stage=stage, public_message="No.", exposed=True)


COMPLETE_REFUSALS: list[tuple[str, Metadata, Callable[[str, str], dict[str, Any]], Any, str]] = [
    (
        "missing-grant-token",
        ORDERS,
        lambda i, t: {"grant_token": ""},
        grpc.StatusCode.INVALID_ARGUMENT,
        "grant_token is required",
    ),
    (
        "missing-invocation-id",
        ORDERS,
        lambda i, t: {"invocation_id": ""},
        grpc.StatusCode.INVALID_ARGUMENT,
        "invocation_id is required",
    ),
    (
        "garbage-grant",
        ORDERS,
        lambda i, t: {"grant_token": "not-a-grant"},
        grpc.StatusCode.PERMISSION_DENIED,
        "grant not accepted",
    ),
    (
        "forged-grant",
        ORDERS,
        lambda i, t: {"grant_token": forge_grant(t)},
        grpc.StatusCode.PERMISSION_DENIED,
        "grant not accepted: grant rejected: bad signature",
    ),
    (
        "unspecified-status",
        ORDERS,
        lambda i, t: {"status": governor_pb2.OUTCOME_STATUS_UNSPECIFIED},
        grpc.StatusCode.INVALID_ARGUMENT,
        "status must be SUCCEEDED, FAILED or CANCELLED",
    ),
    (
        "failed-without-failure",
        ORDERS,
        lambda i, t: {"status": governor_pb2.OUTCOME_STATUS_FAILED, "output_json": ""},
        grpc.StatusCode.INVALID_ARGUMENT,
        "a failed outcome needs a failure with a code",
    ),
    (
        "cancelled-without-failure",
        ORDERS,
        lambda i, t: {"status": governor_pb2.OUTCOME_STATUS_CANCELLED, "output_json": ""},
        grpc.StatusCode.INVALID_ARGUMENT,
        "a cancelled outcome needs a failure with a code",
    ),
    (
        "succeeded-with-failure",
        ORDERS,
        lambda i, t: {"failure": failed_outcome()},
        grpc.StatusCode.INVALID_ARGUMENT,
        "a succeeded outcome carries no failure",
    ),
    (
        "unknown-stage",
        ORDERS,
        lambda i, t: {
            "status": governor_pb2.OUTCOME_STATUS_FAILED,
            "failure": failed_outcome(stage="nowhere"),
        },
        grpc.StatusCode.INVALID_ARGUMENT,
        "unknown stage 'nowhere'",
    ),
    (
        "failure-details-not-json",
        ORDERS,
        lambda i, t: {
            "status": governor_pb2.OUTCOME_STATUS_FAILED,
            "failure": errors_pb2.Failure(code="NOT_ELIGIBLE", stage="execution", details_json="{"),
        },
        grpc.StatusCode.INVALID_ARGUMENT,
        "failure.details_json is not valid JSON",
    ),
    (
        "output-not-json",
        ORDERS,
        lambda i, t: {"output_json": "{n: 1}"},
        grpc.StatusCode.INVALID_ARGUMENT,
        "output_json is not valid JSON",
    ),
    (
        "output-nan",
        ORDERS,
        lambda i, t: {"output_json": '{"n": NaN, "note": ""}'},
        grpc.StatusCode.INVALID_ARGUMENT,
        "output_json is not valid JSON",
    ),
    (
        "failure-details-nan",
        ORDERS,
        lambda i, t: {
            "status": governor_pb2.OUTCOME_STATUS_FAILED,
            "failure": errors_pb2.Failure(
                code="NOT_ELIGIBLE", stage="execution", details_json='{"left": NaN}'
            ),
        },
        grpc.StatusCode.INVALID_ARGUMENT,
        "failure.details_json is not valid JSON",
    ),
    (
        "another-services-invocation",
        BILLING,
        lambda i, t: {},
        grpc.StatusCode.PERMISSION_DENIED,
        "service 'billing' may not report orders.echo",
    ),
]


@pytest.mark.parametrize(
    ("metadata", "change", "code", "message"),
    [pytest.param(*rest, id=name) for name, *rest in COMPLETE_REFUSALS],
)
def test_complete_refuses_bad_reports_and_leaves_the_invocation_open(
    lab_plant: Plant,
    lab_stubs: Stubs,
    metadata: Metadata,
    change: Callable[[str, str], dict[str, Any]],
    code: grpc.StatusCode,
    message: str,
) -> None:
    invocation_id, token = begin_grant(lab_stubs, lab_plant)
    fields = {"invocation_id": invocation_id, "grant_token": token, **change(invocation_id, token)}
    request = complete_request(**fields)
    assert_refused(lab_stubs.governor.Complete, request, metadata, code, message)
    assert invocation_state(lab_plant, invocation_id) == "granted"
    assert lab_plant.events(kind="outcome") == []
    assert_chain_intact(lab_plant)
    # The refusal consumed nothing: the owner can still report the outcome.
    response = lab_stubs.governor.Complete(
        complete_request(invocation_id, token), metadata=ORDERS, timeout=10
    )
    (row,) = lab_plant.events(kind="outcome")
    assert row["seq"] == response.audit_seq and row["status"] == "succeeded"
    assert invocation_state(lab_plant, invocation_id) == "completed"


def test_complete_refuses_a_grant_for_another_invocation(
    lab_plant: Plant, lab_stubs: Stubs
) -> None:
    first_id, _ = begin_grant(lab_stubs, lab_plant)
    second_id, second_token = begin_grant(lab_stubs, lab_plant)
    assert_refused(
        lab_stubs.governor.Complete,
        complete_request(first_id, second_token),
        ORDERS,
        grpc.StatusCode.PERMISSION_DENIED,
        "the grant was issued for another invocation",
    )
    assert invocation_state(lab_plant, first_id) == "granted"
    assert invocation_state(lab_plant, second_id) == "granted"
    assert lab_plant.events(kind="outcome") == []
    assert_chain_intact(lab_plant)


def test_complete_with_another_outcome_after_the_first_is_already_exists(
    lab_plant: Plant, lab_stubs: Stubs
) -> None:
    invocation_id, token = begin_grant(lab_stubs, lab_plant)
    lab_stubs.governor.Complete(complete_request(invocation_id, token), metadata=ORDERS, timeout=10)
    assert_refused(
        lab_stubs.governor.Complete,
        complete_request(
            invocation_id,
            token,
            status=governor_pb2.OUTCOME_STATUS_FAILED,
            output_json="",
            failure=failed_outcome(),
        ),
        ORDERS,
        grpc.StatusCode.ALREADY_EXISTS,
        f"another outcome of {invocation_id} was already reported",
    )
    (row,) = lab_plant.events(kind="outcome")
    assert row["status"] == "succeeded"
    assert invocation_state(lab_plant, invocation_id) == "completed"
    assert_chain_intact(lab_plant)


@pytest.mark.parametrize(
    ("input_json", "decided"),
    [('{"n": 1}', "granted"), ('{"n": 101}', "failed"), ('{"n": 42}', "suspended")],
    ids=["grant", "denial", "suspension"],
)
def test_si3_concurrent_begins_with_one_invocation_id_make_one_decision(
    lab_plant: Plant, lab_stubs: Stubs, input_json: str, decided: str
) -> None:
    """The store, not a read before the write, makes an id good for one decision:
    twelve Begins racing with one id give one decision (and at most one
    approval request) and eleven INVALID_ARGUMENTs, each on the record."""
    from concurrent.futures import ThreadPoolExecutor

    request = begin_request(lab_plant, input_json=input_json)

    def attempt(_: int) -> str:
        try:
            lab_stubs.governor.Begin(request, metadata=ORDERS, timeout=10)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
            assert f"invocation_id {request.invocation_id} was already used" in (
                error.details() or ""
            )
            return "refused"
        return "answered"

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(attempt, range(12)))
    assert sorted(answers) == ["answered"] + ["refused"] * 11
    statuses = sorted(
        r["status"] for r in lab_plant.events(kind="decision", invocation_id=request.invocation_id)
    )
    assert statuses == sorted([decided] + ["rejected"] * 11)
    approvals = lab_plant.rows("SELECT * FROM approvals")
    assert len(approvals) == (1 if decided == "suspended" else 0)
    assert_chain_intact(lab_plant)
