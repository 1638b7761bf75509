"""What one request may ask of the plane: every JSON field bounded in depth,
size and number range, capability ids, audit filters (durations, page tokens,
globs) and registrations bounded in count and size, schema patterns on RE2.

Each limit answers with a designed error (never INTERNAL, never Python's own
words), refused Begins stay on the record (SI-3), and nothing beyond a limit
is stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import warden
from tests.conftest import Plant, make_config, one_process
from tests.integration.lab import Lab
from tests.integration.test_rpc_input import (
    BILLING,
    ORDERS,
    Stubs,
    assert_chain_intact,
    assert_refused,
    begin_grant,
    begin_request,
    complete_request,
    definition,
    open_stubs,
)
from warden.shared.canonical import MAX_JSON_DEPTH
from warden.v1 import audit_pb2, audit_pb2_grpc, errors_pb2, governor_pb2, registry_pb2
from warden_server.app import Server, serve
from warden_server.config import LimitsSection
from warden_server.plane import Plane

DEEP_OBJECT = '{"a":' * 10_000 + "1" + "}" * 10_000
"""Nested far beyond any limit: Python's own parser gives up with a RecursionError."""
DEEP_ENOUGH = '{"a":' * (MAX_JSON_DEPTH + 1) + "1" + "}" * (MAX_JSON_DEPTH + 1)
"""One level beyond the limit, which Python's parser reads without complaint."""
PYTHON_WORDS = ("sys.set_int_max_str_digits", "Not enough segments", "Traceback", "recursion")


def assert_no_python_words(text: str) -> None:
    for words in PYTHON_WORDS:
        assert words not in text, text


@pytest.fixture
def stubs(plant: Plant) -> Iterator[Stubs]:
    with open_stubs(plant) as opened:
        yield opened


@pytest.fixture
def lab_stubs(lab_plant: Plant, lab_rt: warden.Runtime) -> Iterator[Stubs]:
    with open_stubs(lab_plant) as opened:
        yield opened


# -- Begin: context_json -----------------------------------------------------------


@pytest.mark.parametrize(
    ("context_json", "message"),
    [
        (DEEP_OBJECT, f"context_json is nested more than {MAX_JSON_DEPTH} levels deep"),
        (DEEP_ENOUGH, f"context_json is nested more than {MAX_JSON_DEPTH} levels deep"),
        ('{"n": ' + "9" * 5000 + "}", "context_json has an integer of more than 32 digits"),
        ('{"n": 1e400}', "context_json has a number beyond the range of a double"),
        ('{"n": 18446744073709551616}', "context_json has no canonical JSON form"),
        ('{"n": "' + "x" * 70_000 + '"}', "context_json is larger than 65536 bytes"),
    ],
    ids=["deep-10000", "deep-65", "integer-5000-digits", "1e400", "integer-2-64", "too-large"],
)
def test_si3_begin_with_context_beyond_the_limits_is_refused_and_audited(
    lab_plant: Plant, lab_stubs: Stubs, lab: Lab, context_json: str, message: str
) -> None:
    request = begin_request(lab_plant, context_json=context_json)
    error = _refused(lab_stubs.governor.Begin, request, ORDERS)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert message in (error.details() or "")
    assert_no_python_words(error.details() or "")
    (row,) = lab_plant.events(invocation_id=request.invocation_id)
    assert (row["kind"], row["status"], row["service"]) == ("decision", "rejected", "orders")
    assert message in row["reason"]
    assert lab.count("echo") == 0
    assert_chain_intact(lab_plant)


# -- Begin: input_json -------------------------------------------------------------


@pytest.mark.parametrize(
    ("input_json", "issue"),
    [
        ('{"n": 1, "note": ' + "[" * 10_000 + "]" * 10_000 + "}", "nested more than 64"),
        ('{"n": 1, "x": ' + "[" * 65 + "]" * 65 + "}", "nested more than 64"),
        ('{"n": 1e400}', "must not contain a number beyond the range of a double"),
        ('{"n": ' + "9" * 5000 + "}", "must not contain an integer of more than 32 digits"),
    ],
    ids=["deep-10000", "deep-65", "1e400", "integer-5000-digits"],
)
def test_begin_input_beyond_the_json_limits_is_input_invalid_saying_which_limit(
    lab_plant: Plant, lab_stubs: Stubs, lab: Lab, input_json: str, issue: str
) -> None:
    """A governed INPUT_INVALID whose issue names the limit: 1e400 is no longer
    'must contain only valid Unicode text'."""
    request = begin_request(lab_plant, input_json=input_json)
    response = lab_stubs.governor.Begin(request, metadata=ORDERS, timeout=10)
    failure = response.failure
    assert (failure.code, failure.stage) == ("INPUT_INVALID", "input-validation")
    (found,) = json.loads(failure.details_json)["issues"]
    assert found["path"] == "" and issue in found["message"]
    (row,) = lab_plant.events(invocation_id=request.invocation_id)
    assert (row["status"], row["reason"]) == ("failed", "input-beyond-limits")
    assert lab.count("echo") == 0


# -- Begin: capability ids that cannot name a capability ------------------------------


@pytest.mark.parametrize("capability_id", ["", "orders." + "x" * 300], ids=["empty", "too-long"])
def test_si8_sdk_answers_an_id_that_cannot_name_a_capability_as_not_found(
    lab_plant: Plant, lab_rt: warden.Runtime, capability_id: str
) -> None:
    """Not GOVERNANCE_UNAVAILABLE 'try again later': the unknown-capability answer."""
    envelope = lab_rt.invoke(capability_id, {"n": 1}, actor=lab_plant.token())
    assert envelope.status == "failed" and envelope.error is not None
    assert envelope.error.to_model() == {
        "code": "CAPABILITY_NOT_FOUND",
        "message": "Capability not found.",
        "retryable": False,
    }
    (row,) = lab_plant.events(invocation_id=envelope.invocation_id)
    assert row["reason"] == "malformed-capability-id"
    assert len(row["capability_id"] or "") <= 201


# -- Complete ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"output_json": '{"n": ' + "[" * 10_000 + "]" * 10_000 + "}"},
            f"output_json is not valid JSON: is nested more than {MAX_JSON_DEPTH} levels deep",
        ),
        (
            {
                "status": governor_pb2.OUTCOME_STATUS_FAILED,
                "output_json": "",
                "failure": errors_pb2.Failure(
                    code="NOT_ELIGIBLE", stage="execution", details_json=DEEP_OBJECT
                ),
            },
            f"failure.details_json is nested more than {MAX_JSON_DEPTH} levels deep",
        ),
    ],
    ids=["deep-output", "deep-failure-details"],
)
def test_complete_with_json_beyond_the_limits_is_invalid_argument(
    lab_plant: Plant, lab_stubs: Stubs, fields: dict[str, Any], message: str
) -> None:
    invocation_id, token = begin_grant(lab_stubs, lab_plant)
    assert_refused(
        lab_stubs.governor.Complete,
        complete_request(invocation_id, token, **fields),
        ORDERS,
        grpc.StatusCode.INVALID_ARGUMENT,
        message,
    )
    assert lab_plant.events(kind="outcome") == []


# -- ListCapabilities and GetCapability ------------------------------------------------


def test_discovery_with_deep_context_or_a_malformed_actor_token_is_refused_plainly(
    lab_plant: Plant, lab_stubs: Stubs
) -> None:
    deep = {"actor_token": lab_plant.token(), "context_json": DEEP_OBJECT}
    for call, request in [
        (lab_stubs.registry.ListCapabilities, registry_pb2.ListCapabilitiesRequest(**deep)),
        (
            lab_stubs.registry.GetCapability,
            registry_pb2.GetCapabilityRequest(id="orders.echo", **deep),
        ),
    ]:
        assert_refused(
            call,
            request,
            ORDERS,
            grpc.StatusCode.INVALID_ARGUMENT,
            f"context_json is nested more than {MAX_JSON_DEPTH} levels deep",
        )
    error = _refused(
        lab_stubs.registry.ListCapabilities,
        registry_pb2.ListCapabilitiesRequest(actor_token="abc"),
        ORDERS,
    )
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error.details() == "actor token rejected: not a well-formed JWT"


# -- Register: schemas ------------------------------------------------------------------


def test_redos_register_refuses_a_pattern_re2_cannot_run_naming_where_it_is(
    plant: Plant, stubs: Stubs
) -> None:
    schema = json.dumps(
        {"type": "object", "properties": {"code": {"type": "string", "pattern": r"^(a)\1$"}}}
    )
    assert_refused(
        stubs.registry.Register,
        registry_pb2.RegisterRequest(capabilities=[definition(input_schema_json=schema)]),
        ORDERS,
        grpc.StatusCode.INVALID_ARGUMENT,
        "orders.probe: input_schema: at /properties/code/pattern: pattern '^(a)\\\\1$' "
        "is not supported by RE2",
    )
    assert plant.rows("SELECT * FROM capabilities") == []


def test_redos_evil_pattern_input_is_validated_by_the_plane(plant: Plant, stubs: Stubs) -> None:
    """The pattern that froze the plane for seconds on 27 characters answers
    correctly (RE2 matches in linear time). The input is kept short enough that
    a backtracking engine, if one came back, would answer slowly, not hang."""
    schema = json.dumps(
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    )
    stubs.registry.Register(
        registry_pb2.RegisterRequest(capabilities=[definition(input_schema_json=schema)]),
        metadata=ORDERS,
        timeout=10,
    )
    for text, valid in [("a" * 22 + "!", False), ("a" * 5000, True)]:
        request = begin_request(
            plant, capability_id="orders.probe", input_json=json.dumps({"s": text})
        )
        response = stubs.governor.Begin(request, metadata=ORDERS, timeout=10)
        # The example policies allow nothing in orders.probe: a valid input
        # gets past validation to the policy stage.
        stage = response.failure.stage
        assert (stage != "input-validation") == valid, response.failure


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            '{"properties": {"a": ' * 5_000 + "{}" + "}}" * 5_000,
            "orders.probe: input_schema_json is larger than 65536 bytes",
        ),
        (
            '{"properties": {"a": ' * 40 + "{}" + "}}" * 40,
            f"orders.probe: input_schema_json is nested more than {MAX_JSON_DEPTH} levels deep",
        ),
        (
            json.dumps({"description": "x" * 70_000}),
            "orders.probe: input_schema_json is larger than 65536 bytes",
        ),
    ],
    ids=["deep-and-large", "deep", "large"],
)
def test_register_refuses_a_schema_beyond_the_limits(
    plant: Plant, stubs: Stubs, schema: str, message: str
) -> None:
    assert_refused(
        stubs.registry.Register,
        registry_pb2.RegisterRequest(capabilities=[definition(input_schema_json=schema)]),
        ORDERS,
        grpc.StatusCode.INVALID_ARGUMENT,
        message,
    )
    assert plant.rows("SELECT * FROM capabilities") == []
    assert plant.events(kind="registry") == []


def test_register_refuses_an_id_longer_than_200_characters(plant: Plant, stubs: Stubs) -> None:
    long_id = "orders." + "x" * 200
    assert_refused(
        stubs.registry.Register,
        registry_pb2.RegisterRequest(capabilities=[definition(id=long_id)]),
        ORDERS,
        grpc.StatusCode.INVALID_ARGUMENT,
        "id must be namespace.name in lowercase letters, digits and underscores, "
        "at most 200 characters",
    )


# -- Register: how many, and how much, per call and per service -------------------------


def many(count: int, prefix: str = "orders.c") -> list[registry_pb2.CapabilityDefinition]:
    return [definition(id=f"{prefix}{i}") for i in range(count)]


def test_register_refuses_more_capabilities_than_one_call_may_carry(
    plant: Plant, stubs: Stubs
) -> None:
    """Refused before any schema is read: 20,000 in one call held the writer for 41 s."""
    assert_refused(
        stubs.registry.Register,
        registry_pb2.RegisterRequest(capabilities=many(101)),
        ORDERS,
        grpc.StatusCode.INVALID_ARGUMENT,
        "101 capabilities in one Register call; at most 100 ([limits] "
        "max_capabilities_per_register)",
    )
    assert plant.rows("SELECT * FROM capabilities") == []
    response = stubs.registry.Register(
        registry_pb2.RegisterRequest(capabilities=many(100)), metadata=ORDERS, timeout=30
    )
    assert len(response.capabilities) == 100


@pytest.fixture
def limited_plane(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Plant]]:
    """Start a plane with the example policies and these ``[limits]``."""
    servers: list[Server] = []

    def start(**limits: Any) -> Plant:
        config = make_config(tmp_path, **one_process(request))
        config = config.model_copy(update={"limits": LimitsSection(**limits)})
        running = serve(Plane.from_config(config), "127.0.0.1:0")
        servers.append(running)
        return Plant(running, tmp_path)

    yield start
    for running in servers:
        running.stop(grace=0)


def test_register_refuses_a_registry_beyond_the_services_share_all_or_nothing(
    limited_plane: Callable[..., Plant],
) -> None:
    plant = limited_plane(max_capabilities_per_service=5)
    with open_stubs(plant) as stubs:
        stubs.registry.Register(
            registry_pb2.RegisterRequest(capabilities=many(3)), metadata=ORDERS, timeout=10
        )
        # A new version of a registered capability takes no more of the share.
        changed = definition(id="orders.c0", description="Changed.")
        stubs.registry.Register(
            registry_pb2.RegisterRequest(capabilities=[changed]), metadata=ORDERS, timeout=10
        )
        assert_refused(
            stubs.registry.Register,
            registry_pb2.RegisterRequest(capabilities=many(3, "orders.d")),
            ORDERS,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "service 'orders' would have 6 capabilities; at most 5 "
            "([limits] max_capabilities_per_service)",
        )
        ids = {r["id"] for r in plant.rows("SELECT id FROM capabilities")}
        assert ids == {"orders.c0", "orders.c1", "orders.c2"}
        # Another service's share is its own.
        stubs.registry.Register(
            registry_pb2.RegisterRequest(capabilities=many(5, "billing.b")),
            metadata=BILLING,
            timeout=10,
        )
    assert_chain_intact(plant)


def test_register_refuses_definitions_beyond_the_services_bytes(
    limited_plane: Callable[..., Plant],
) -> None:
    """Discovery answers with a service's whole registry: its bytes are bounded
    so that the answer always fits one message."""
    plant = limited_plane(max_registry_bytes_per_service=4_000)
    big = definition(id="orders.big", description="x" * 3_000)
    with open_stubs(plant) as stubs:
        stubs.registry.Register(
            registry_pb2.RegisterRequest(capabilities=[big]), metadata=ORDERS, timeout=10
        )
        error = _refused(
            stubs.registry.Register,
            registry_pb2.RegisterRequest(
                capabilities=[definition(id="orders.other", description="y" * 3_000)]
            ),
            ORDERS,
        )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "bytes of capability definitions; at most 4000" in (error.details() or "")
    assert [r["id"] for r in plant.rows("SELECT id FROM capabilities")] == ["orders.big"]


# -- discovery reads only the calling service's namespaces --------------------------------


def test_discovery_reads_only_the_calling_services_namespaces_through_the_index(
    plant: Plant,
) -> None:
    """Every service's discovery scanned every service's capabilities; now it
    reads a range of the primary key per namespace, so its cost follows its
    own registry alone."""
    with open_stubs(plant) as stubs:
        stubs.registry.Register(
            registry_pb2.RegisterRequest(capabilities=many(20)), metadata=ORDERS, timeout=10
        )
        stubs.registry.Register(
            registry_pb2.RegisterRequest(capabilities=many(2, "billing.b")),
            metadata=BILLING,
            timeout=10,
        )
    store = plant.server.plane.store
    latest = store.latest_capabilities(("billing",))
    assert [r.id for r in latest] == ["billing.b0", "billing.b1"]
    assert store.latest_capabilities(("nothing",)) == []
    plan = _query_plan(plant, ("billing",))
    assert "SCAN" not in plan, plan
    assert "(id>? AND id<?)" in plan, plan


def _query_plan(plant: Plant, namespaces: tuple[str, ...]) -> str:
    from warden_server.store.sqlite import _LATEST, _in_namespaces

    where, params = _in_namespaces(namespaces)
    rows = plant.rows(
        f"EXPLAIN QUERY PLAN SELECT c.* FROM capabilities c WHERE ({where}) AND {_LATEST}",
        tuple(params),
    )
    return "\n".join(r["detail"] for r in rows)


# -- the audit API: durations, page tokens, globs -----------------------------------------


@pytest.fixture
def audit_stub(plant: Plant) -> Iterator[audit_pb2_grpc.AuditStub]:
    with grpc.insecure_channel(plant.target) as channel:
        yield audit_pb2_grpc.AuditStub(channel)


def audit_query(
    plant: Plant, stub: audit_pb2_grpc.AuditStub, page_token: str = "", **filters: Any
) -> audit_pb2.QueryResponse:
    token = plant.token(sub="chief", roles=("auditor:all",), tenant="")
    request = audit_pb2.QueryRequest(
        filter=audit_pb2.AuditFilter(**filters), limit=10, page_token=page_token
    )
    response: audit_pb2.QueryResponse = stub.Query(
        request, metadata=(("authorization", f"Bearer {token}"),), timeout=10
    )
    return response


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"since": "9999999d"}, "since '9999999d' reaches back before the year 1"),
        ({"until": "99999999999s"}, "until '99999999999s' reaches back before the year 1"),
        ({"page_token": "1" + "0" * 23}, "page_token is not one this API issued"),
        ({"page_token": "-5"}, "page_token is not one this API issued"),
        ({"page_token": "0"}, "page_token is not one this API issued"),
        ({"capabilities": ["orders.*"] * 33}, "33 capability patterns; a filter holds at most 32"),
        ({"capabilities": ["orders." + "x" * 300]}, "a capability pattern is longer than 256"),
        ({"actor": "a" * 1000}, "actor is longer than 256 characters"),
    ],
    ids=[
        "since-beyond-the-calendar",
        "until-beyond-the-calendar",
        "page-token-10e23",
        "page-token-negative",
        "page-token-zero",
        "too-many-globs",
        "glob-too-long",
        "actor-too-long",
    ],
)
def test_audit_query_beyond_the_limits_is_invalid_argument(
    plant: Plant, audit_stub: audit_pb2_grpc.AuditStub, fields: dict[str, Any], message: str
) -> None:
    error = _refused(lambda request, **_: audit_query(plant, audit_stub, **fields), None, ())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert message in (error.details() or "")


@pytest.mark.parametrize(
    "pattern", ["\U0010ffff*", "orders.\U0010ffff\U0010ffff*", "orders.\ud7ff*"]
)
def test_audit_query_glob_at_the_end_of_unicode_answers(
    plant: Plant, audit_stub: audit_pb2_grpc.AuditStub, pattern: str
) -> None:
    """The glob's index range ends at the character after its prefix; there is
    none after U+10FFFF (and U+D800 is not text)."""
    assert audit_query(plant, audit_stub, capabilities=[pattern]).records == []


def _refused(call: Callable[..., Any], request: Any, metadata: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call(request, metadata=metadata, timeout=30)
    return raised.value
