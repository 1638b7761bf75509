"""Runtime.discover: what an actor may see on a surface, through the real plane."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.lab import EchoIn, EchoOut, Lab, build_lab


def ids(found: list[warden.DiscoveredCapability]) -> list[str]:
    return [c.id for c in found]


def test_discover_shows_each_surface_what_is_exposed_on_it_and_not_hidden(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    token = lab_plant.token()
    every = ["orders.admin", "orders.aslow", "orders.echo", "orders.slow"]
    assert ids(lab_rt.discover(actor=token)) == every
    assert ids(lab_rt.discover(actor=token, surface="openai")) == every
    assert ids(lab_rt.discover(actor=token, surface="mcp")) == sorted([*every, "orders.mcp_only"])
    admin = lab_plant.token(roles=("admin",))
    assert "orders.secret" in ids(lab_rt.discover(actor=admin))


def test_discover_describes_the_registered_capability(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    (echo,) = [c for c in lab_rt.discover(actor=lab_plant.token()) if c.id == "orders.echo"]
    assert (echo.version, echo.service, echo.side_effect) == ("1", "orders", "read")
    assert echo.input_schema == EchoIn.model_json_schema()
    assert echo.output_schema == EchoOut.model_json_schema(mode="serialization")
    assert echo.tags == ()


def test_discover_registers_the_runtime_first(lab_plant: Plant, lab: Lab) -> None:
    rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab)
    try:
        assert "orders.echo" in ids(rt.discover(actor=lab_plant.token()))
    finally:
        rt.close()


CHAT_ONLY = """
rules:
  - id: allow
    capabilities: ["orders.*"]
    effect: allow
  - id: echo-in-chat-only
    capabilities: ["orders.echo"]
    effect: hide
    when: '!has(context.channel) || context.channel != "chat"'
"""


def test_discover_passes_context_to_policies(
    start_plane: Callable[..., Plant], policy_dir: Callable[[str], Path], lab: Lab
) -> None:
    plant = start_plane(policy_dir(CHAT_ONLY))
    rt = build_lab(plant.target, ORDERS_TOKEN, lab)
    try:
        token = plant.token()
        assert "orders.echo" in ids(rt.discover(actor=token, context={"channel": "chat"}))
        assert "orders.echo" not in ids(rt.discover(actor=token, context={"channel": "mail"}))
        assert "orders.echo" not in ids(rt.discover(actor=token))
    finally:
        rt.close()


@pytest.mark.parametrize("actor", [None, "not-a-jwt"])
def test_discover_for_a_refused_actor_raises_unauthenticated(
    lab_rt: warden.Runtime, actor: str | None
) -> None:
    with pytest.raises(warden.CapabilityError) as raised:
        lab_rt.discover(actor=actor)
    assert (raised.value.code, raised.value.stage) == ("UNAUTHENTICATED", "authentication")
    assert raised.value.cause is not None


@pytest.mark.fixed_processes
def test_discover_fails_closed_when_the_plane_cannot_be_asked(lab: Lab) -> None:
    rt = build_lab("127.0.0.1:9", ORDERS_TOKEN, lab, governance_timeout_ms=300)
    try:
        with pytest.raises(warden.CapabilityError) as raised:
            rt.discover(actor="any")
    finally:
        rt.close()
    assert raised.value.code == "GOVERNANCE_UNAVAILABLE" and raised.value.retryable
