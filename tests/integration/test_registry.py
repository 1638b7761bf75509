"""The capability registry against a real plane: versions, namespace ownership
(SI-7) and what discovery shows to whom (SI-8)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from pydantic import BaseModel

import warden
from tests.conftest import BILLING_TOKEN, ORDERS_TOKEN, Plant
from warden.v1 import governor_pb2, governor_pb2_grpc, registry_pb2, registry_pb2_grpc
from warden_server import registry
from warden_server.audit.chain import verify_rows

ORDERS = (("x-warden-service-token", ORDERS_TOKEN),)
BILLING = (("x-warden-service-token", BILLING_TOKEN),)
LAB_CAPABILITIES = {
    "orders.echo",
    "orders.slow",
    "orders.aslow",
    "orders.secret",
    "orders.mcp_only",
    "orders.admin",
}


class NoteV1(BaseModel):
    n: int


class NoteV2(BaseModel):
    n: int
    reason: str


class NoteOut(BaseModel):
    n: int


class Stubs:
    def __init__(self, channel: grpc.Channel) -> None:
        self.governor = governor_pb2_grpc.GovernorStub(channel)
        self.registry = registry_pb2_grpc.RegistryStub(channel)


@pytest.fixture
def stubs(lab_plant: Plant) -> Iterator[Stubs]:
    channel = grpc.insecure_channel(lab_plant.target)
    yield Stubs(channel)
    channel.close()


@pytest.fixture
def runtimes(lab_plant: Plant) -> Iterator[Any]:
    """Build runtimes against the lab plane; each is closed at teardown."""
    built: list[warden.Runtime] = []

    def build(
        input: type[BaseModel] = NoteV1,
        *,
        capability_id: str = "orders.note",
        version: str | None = None,
        service: str = "orders",
        token: str = ORDERS_TOKEN,
    ) -> warden.Runtime:
        rt = warden.Runtime(lab_plant.target, service=service, token=token)
        built.append(rt)

        @rt.capability(
            capability_id, input=input, output=NoteOut, side_effect="read", version=version
        )
        def note(inp: BaseModel, ctx: warden.Context) -> NoteOut:
            return NoteOut(n=inp.n)  # type: ignore[attr-defined]

        return rt

    yield build
    for rt in built:
        rt.close()


def registry_rows(plant: Plant, capability_id: str = "orders.note") -> list[dict[str, Any]]:
    return plant.rows(
        "SELECT * FROM audit_events WHERE kind = 'registry' AND capability_id = ? ORDER BY seq",
        (capability_id,),
    )


def stored_versions(plant: Plant, capability_id: str = "orders.note") -> list[str]:
    rows = plant.rows(
        "SELECT version FROM capabilities WHERE id = ? ORDER BY ordinal", (capability_id,)
    )
    return [r["version"] for r in rows]


def get_capability(stubs: Stubs, plant: Plant, **fields: Any) -> registry_pb2.Capability:
    request = registry_pb2.GetCapabilityRequest(actor_token=plant.token(), **fields)
    return stubs.registry.GetCapability(request, metadata=ORDERS, timeout=10).capability


def begin(stubs: Stubs, plant: Plant, metadata: Any = ORDERS, **fields: Any) -> Any:
    request = governor_pb2.BeginRequest(
        invocation_id=str(uuid.uuid4()), actor_token=plant.token(), **fields
    )
    return stubs.governor.Begin(request, metadata=metadata, timeout=10)


def assert_chain_intact(plant: Plant) -> None:
    rows = plant.rows()
    result = verify_rows(rows)
    assert result.ok and result.checked == len(rows), result


# -- versions -------------------------------------------------------------------------


def test_registering_the_same_definition_twice_is_a_no_op(lab_plant: Plant, runtimes: Any) -> None:
    first = runtimes().register()
    again = runtimes().register()
    assert [(c.id, c.version) for c in first] == [("orders.note", "1")]
    assert again == first
    assert stored_versions(lab_plant) == ["1"]
    assert len(registry_rows(lab_plant)) == 1


def test_a_changed_schema_without_a_version_becomes_version_2(
    lab_plant: Plant, runtimes: Any
) -> None:
    (v1,) = runtimes(NoteV1).register()
    (v2,) = runtimes(NoteV2).register()
    assert (v1.version, v2.version) == ("1", "2")
    assert v1.digest != v2.digest
    assert stored_versions(lab_plant) == ["1", "2"]
    assert [r["capability_version"] for r in registry_rows(lab_plant)] == ["1", "2"]


def test_an_explicit_version_reused_for_another_definition_is_refused(
    lab_plant: Plant, runtimes: Any, stubs: Stubs
) -> None:
    (kept,) = runtimes(NoteV1, version="1.0").register()
    assert kept.version == "1.0"
    with pytest.raises(warden.WardenError) as raised:
        runtimes(NoteV2, version="1.0").register()
    message = str(raised.value)
    assert "ALREADY_EXISTS" in message
    assert "orders.note version 1.0 is already registered with a different definition" in message

    # The same refusal, seen on the wire.
    changed = runtimes(NoteV2, version="1.0").capabilities["orders.note"].to_proto()
    with pytest.raises(grpc.RpcError) as wire:
        stubs.registry.Register(
            registry_pb2.RegisterRequest(capabilities=[changed]), metadata=ORDERS, timeout=10
        )
    assert wire.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "a changed definition needs a new version" in (wire.value.details() or "")

    assert stored_versions(lab_plant) == ["1.0"]
    assert len(registry_rows(lab_plant)) == 1
    stored = get_capability(stubs, lab_plant, id="orders.note", version="1.0")
    assert stored.digest == kept.digest
    # Registering the original again under its explicit version is still fine.
    assert runtimes(NoteV1, version="1.0").register() == [kept]


def test_an_explicit_version_may_not_reuse_a_number_the_plane_gave(
    lab_plant: Plant, runtimes: Any
) -> None:
    runtimes(NoteV1).register()
    with pytest.raises(warden.WardenError, match="ALREADY_EXISTS"):
        runtimes(NoteV2, version="1").register()
    assert stored_versions(lab_plant) == ["1"]


def test_both_versions_stay_resolvable_and_begin_uses_the_latest(
    lab_plant: Plant, runtimes: Any, stubs: Stubs
) -> None:
    runtimes(NoteV1).register()
    runtimes(NoteV2).register()

    v1 = get_capability(stubs, lab_plant, id="orders.note", version="1")
    v2 = get_capability(stubs, lab_plant, id="orders.note", version="2")
    latest = get_capability(stubs, lab_plant, id="orders.note")
    assert v1.definition.version == "1" and v2.definition.version == "2"
    assert "reason" not in json.loads(v1.definition.input_schema_json)["properties"]
    assert "reason" in json.loads(v2.definition.input_schema_json)["required"]
    assert latest == v2

    # Without a version Begin resolves the latest, and validates against its schema.
    old_shape = begin(stubs, lab_plant, capability_id="orders.note", input_json='{"n": 1}')
    assert old_shape.failure.code == "INPUT_INVALID"
    assert json.loads(old_shape.failure.details_json) == {
        "issues": [{"path": "/reason", "message": "is required"}]
    }
    new_shape = begin(
        stubs, lab_plant, capability_id="orders.note", input_json='{"n": 1, "reason": "x"}'
    )
    assert new_shape.grant.capability_version == "2"
    pinned = begin(
        stubs,
        lab_plant,
        capability_id="orders.note",
        capability_version="1",
        input_json='{"n": 1}',
    )
    assert pinned.grant.capability_version == "1"
    versions = [
        r["capability_version"]
        for r in lab_plant.events(kind="decision", capability_id="orders.note")
    ]
    assert versions == ["2", "2", "1"]


@pytest.mark.single_process
def test_each_versions_input_schema_is_compiled_once_however_many_calls_it_checks(
    lab_plant: Plant, runtimes: Any, stubs: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No per-request work that can be done once: a version's validator is
    built on its first call and serves every later one."""
    compiled: list[str] = []
    compile_validator = registry.compile_validator

    def counted(schema: dict[str, Any]) -> Any:
        compiled.append(json.dumps(schema, sort_keys=True))
        return compile_validator(schema)

    monkeypatch.setattr(registry, "compile_validator", counted)
    runtimes(NoteV1).register()
    runtimes(NoteV2).register()
    checked_at_registration = len(compiled)
    for n in range(5):
        latest = begin(
            stubs, lab_plant, capability_id="orders.note", input_json=f'{{"n": {n}, "reason": "x"}}'
        )
        assert latest.grant.capability_version == "2"
        pinned = begin(
            stubs,
            lab_plant,
            capability_id="orders.note",
            capability_version="1",
            input_json=f'{{"n": {n}}}',
        )
        assert pinned.grant.capability_version == "1"
    validating = compiled[checked_at_registration:]
    assert len(validating) <= 2 and len(set(validating)) == len(validating), validating


def test_registration_writes_a_registry_audit_record(lab_plant: Plant, runtimes: Any) -> None:
    (registered,) = runtimes().register()
    (row,) = registry_rows(lab_plant)
    assert row["status"] == "registered"
    assert row["capability_version"] == registered.version == "1"
    assert row["service"] == "orders"
    assert row["input_digest"] == registered.digest
    assert json.loads(row["details"]) == {
        "side_effect": "read",
        "exposure": ["mcp", "openai", "direct"],
    }
    assert_chain_intact(lab_plant)


# -- namespace ownership (SI-7) -----------------------------------------------------------


def test_si7_service_cannot_register_outside_its_namespaces(
    lab_plant: Plant, runtimes: Any, stubs: Stubs
) -> None:
    intruder = runtimes(capability_id="orders.note", service="billing", token=BILLING_TOKEN)
    with pytest.raises(warden.WardenError) as raised:
        intruder.register()
    assert "PERMISSION_DENIED" in str(raised.value)
    assert "service 'billing' does not own the namespace of orders.note (it owns: billing)" in str(
        raised.value
    )

    for metadata, capability_id, owner in [
        (ORDERS, "billing.charge", "orders"),
        (ORDERS, "ordersextra.refund", "orders"),
        (BILLING, "orders.refund", "billing"),
    ]:
        definition = runtimes(capability_id=capability_id).capabilities[capability_id].to_proto()
        with pytest.raises(grpc.RpcError) as wire:
            stubs.registry.Register(
                registry_pb2.RegisterRequest(capabilities=[definition]),
                metadata=metadata,
                timeout=10,
            )
        assert wire.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"service {owner!r} does not own the namespace of {capability_id}" in (
            wire.value.details() or ""
        )

    assert lab_plant.rows("SELECT * FROM capabilities") == []
    # Every attempt is on the record, with who tried which namespace.
    refused = lab_plant.events(kind="registry")
    assert [(e["status"], e["service"], e["capability_id"]) for e in refused] == [
        ("refused", "billing", "orders.note"),
        ("refused", "orders", "billing.charge"),
        ("refused", "orders", "ordersextra.refund"),
        ("refused", "billing", "orders.refund"),
    ]
    assert all("does not own the namespace" in e["reason"] for e in refused)
    # Its own namespace works.
    billing = runtimes(capability_id="billing.charge", service="billing", token=BILLING_TOKEN)
    (own,) = billing.register()
    assert (own.id, own.version) == ("billing.charge", "1")
    (row,) = lab_plant.rows("SELECT service FROM capabilities WHERE id = 'billing.charge'")
    assert row["service"] == "billing"


def test_si7_service_cannot_report_another_services_invocation(
    lab_plant: Plant, lab_rt: warden.Runtime, stubs: Stubs
) -> None:
    response = begin(stubs, lab_plant, capability_id="orders.echo", input_json='{"n": 1}')
    assert response.WhichOneof("outcome") == "grant"
    invocation_id = response.invocation_id
    report = governor_pb2.CompleteRequest(
        invocation_id=invocation_id,
        grant_token=response.grant.token,
        status=governor_pb2.OUTCOME_STATUS_SUCCEEDED,
        output_json='{"n": 1, "note": ""}',
    )
    with pytest.raises(grpc.RpcError) as raised:
        stubs.governor.Complete(report, metadata=BILLING, timeout=10)
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert raised.value.details() == "service 'billing' may not report orders.echo"

    (invocation,) = lab_plant.rows(
        "SELECT state, service FROM invocations WHERE invocation_id = ?", (invocation_id,)
    )
    assert invocation == {"state": "granted", "service": "orders"}
    assert lab_plant.events(invocation_id=invocation_id, kind="outcome") == []
    assert_chain_intact(lab_plant)

    # The owner's report still lands.
    stubs.governor.Complete(report, metadata=ORDERS, timeout=10)
    (outcome,) = lab_plant.events(invocation_id=invocation_id, kind="outcome")
    assert outcome["service"] == "orders" and outcome["status"] == "succeeded"


def test_si7_service_cannot_begin_another_services_capability(
    lab_plant: Plant, lab_rt: warden.Runtime, stubs: Stubs
) -> None:
    response = begin(
        stubs, lab_plant, metadata=BILLING, capability_id="orders.echo", input_json='{"n": 1}'
    )
    assert response.failure.code == "CAPABILITY_NOT_FOUND"
    (row,) = lab_plant.events(invocation_id=response.invocation_id)
    assert row["service"] == "billing"
    assert row["reason"] == "not-owned-by-service:billing"
    assert lab_plant.rows("SELECT * FROM invocations") == []


# -- discovery (SI-8) -----------------------------------------------------------------------


def listed(stubs: Stubs, plant: Plant, roles: tuple[str, ...], surface: str = "") -> set[str]:
    request = registry_pb2.ListCapabilitiesRequest(
        actor_token=plant.token(roles=roles), surface=surface
    )
    response = stubs.registry.ListCapabilities(request, metadata=ORDERS, timeout=10)
    return {c.definition.id for c in response.capabilities}


@pytest.mark.parametrize(
    ("roles", "surface", "hidden"),
    [
        (("support",), "", {"orders.secret", "orders.mcp_only"}),
        (("support",), "direct", {"orders.secret", "orders.mcp_only"}),
        (("support",), "openai", {"orders.secret", "orders.mcp_only"}),
        (("support",), "mcp", {"orders.secret"}),
        (("admin",), "direct", {"orders.mcp_only"}),
        (("admin",), "mcp", set()),
    ],
)
def test_list_capabilities_shows_only_what_the_actor_may_see(
    lab_plant: Plant,
    lab_rt: warden.Runtime,
    stubs: Stubs,
    roles: tuple[str, ...],
    surface: str,
    hidden: set[str],
) -> None:
    assert listed(stubs, lab_plant, roles, surface) == LAB_CAPABILITIES - hidden


def test_list_capabilities_lists_each_capability_once_at_its_latest_version(
    lab_plant: Plant, lab_rt: warden.Runtime, runtimes: Any, stubs: Stubs
) -> None:
    runtimes(NoteV1).register()
    runtimes(NoteV2).register()
    request = registry_pb2.ListCapabilitiesRequest(actor_token=lab_plant.token())
    response = stubs.registry.ListCapabilities(request, metadata=ORDERS, timeout=10)
    notes = [c for c in response.capabilities if c.definition.id == "orders.note"]
    assert [c.definition.version for c in notes] == ["2"]


@pytest.mark.parametrize(
    ("capability_id", "roles", "surface"),
    [
        ("orders.secret", ("support",), "direct"),
        ("orders.mcp_only", ("admin",), "direct"),
        ("orders.mcp_only", ("admin",), "openai"),
    ],
    ids=["hidden-by-policy", "unexposed-direct", "unexposed-openai"],
)
def test_get_capability_for_a_hidden_one_is_the_same_not_found_as_an_unknown_id(
    lab_plant: Plant,
    lab_rt: warden.Runtime,
    stubs: Stubs,
    capability_id: str,
    roles: tuple[str, ...],
    surface: str,
) -> None:
    def error_for(cid: str) -> tuple[grpc.StatusCode, str | None]:
        request = registry_pb2.GetCapabilityRequest(
            id=cid, actor_token=lab_plant.token(roles=roles), surface=surface
        )
        with pytest.raises(grpc.RpcError) as raised:
            stubs.registry.GetCapability(request, metadata=ORDERS, timeout=10)
        return raised.value.code(), raised.value.details()

    hidden = error_for(capability_id)
    unknown = error_for("orders.does_not_exist")
    assert hidden == unknown == (grpc.StatusCode.NOT_FOUND, "Capability not found.")


def test_get_capability_shows_a_hidden_one_to_an_actor_who_may_see_it(
    lab_plant: Plant, lab_rt: warden.Runtime, stubs: Stubs
) -> None:
    secret = registry_pb2.GetCapabilityRequest(
        id="orders.secret", actor_token=lab_plant.token(roles=("admin",))
    )
    found = stubs.registry.GetCapability(secret, metadata=ORDERS, timeout=10).capability
    assert found.definition.id == "orders.secret" and found.service == "orders"
    mcp = registry_pb2.GetCapabilityRequest(
        id="orders.mcp_only", actor_token=lab_plant.token(), surface="mcp"
    )
    found = stubs.registry.GetCapability(mcp, metadata=ORDERS, timeout=10).capability
    assert list(found.definition.exposure) == ["mcp"]


def test_discovery_shows_a_service_only_what_it_can_begin(
    lab_plant: Plant, runtimes: Any, stubs: Stubs
) -> None:
    """Begin conceals another service's capability (CAPABILITY_NOT_FOUND,
    reason not-owned-by-service); discovery must not offer it either, or a
    model is shown a tool that then does not exist."""
    runtimes(capability_id="billing.charge", service="billing", token=BILLING_TOKEN).register()
    began = begin(stubs, lab_plant, capability_id="billing.charge", input_json='{"n": 1}')
    assert began.failure.code == "CAPABILITY_NOT_FOUND"

    def ids(metadata: Any) -> set[str]:
        request = registry_pb2.ListCapabilitiesRequest(actor_token=lab_plant.token())
        response = stubs.registry.ListCapabilities(request, metadata=metadata, timeout=10)
        return {c.definition.id for c in response.capabilities}

    assert "billing.charge" in ids(BILLING)
    assert "billing.charge" not in ids(ORDERS)
    request = registry_pb2.GetCapabilityRequest(id="billing.charge", actor_token=lab_plant.token())
    with pytest.raises(grpc.RpcError) as raised:
        stubs.registry.GetCapability(request, metadata=ORDERS, timeout=10)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert raised.value.details() == "Capability not found."


class NoteAsText(BaseModel):
    n: str


NOTE_RULES = """
rules:
  - id: allow-all
    capabilities: ["orders.*"]
    effect: allow
  - id: big-notes
    capabilities: ["orders.note"]
    effect: deny
    when: input.n > 100
"""


def test_a_version_that_would_break_a_rule_in_force_is_refused_and_the_previous_serves(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "rules.yaml").write_text(NOTE_RULES)
    plant = start_plane(folder, watch_policies=False)

    def runtime(input: type[BaseModel]) -> warden.Runtime:
        rt = warden.Runtime(plant.target, service="orders", token=ORDERS_TOKEN)

        @rt.capability("orders.note", input=input, output=NoteOut, side_effect="read")
        def note(inp: BaseModel, ctx: warden.Context) -> NoteOut:
            return NoteOut(n=1)

        return rt

    good, bad = runtime(NoteV1), runtime(NoteAsText)
    try:
        good.register()
        with pytest.raises(warden.WardenError) as raised:
            bad.register()
        message = str(raised.value)
        assert "FAILED_PRECONDITION" in message
        assert (
            f"{folder}/rules.yaml:6: rule 'big-notes': when: no operator '>' for (string, int): "
            "input.n is a string in orders.note"
        ) in message
        assert stored_versions(plant) == ["1"]
        with grpc.insecure_channel(plant.target) as channel:
            served = begin(
                Stubs(channel), plant, capability_id="orders.note", input_json='{"n": 5}'
            )
        assert served.grant.capability_version == "1"
    finally:
        good.close()
        bad.close()


def test_a_runtime_with_more_capabilities_than_one_call_takes_registers_them_all(
    lab_plant: Plant, runtimes: Any
) -> None:
    """The plane takes 100 capabilities per Register call by default; the SDK
    sends a runtime's capabilities in as many calls as that needs."""
    rt = runtimes(capability_id="orders.note0")
    for n in range(1, 150):

        @rt.capability(f"orders.note{n}", input=NoteV1, output=NoteOut, side_effect="read")
        def note(inp: NoteV1, ctx: warden.Context) -> NoteOut:
            return NoteOut(n=inp.n)

    registered = rt.register()
    assert sorted(r.id for r in registered) == sorted(f"orders.note{n}" for n in range(150))
    assert len(lab_plant.rows("SELECT id FROM capabilities")) == 150
