"""A JSON Schema ``number`` is a double to the policy checker, which has rules
compare it with doubles (``input.price * 1.2 > 1000.0``). JSON has one number
type: a whole price arrives as ``100`` (or ``100.0``, which reads back as
``100`` from its canonical form). The plane hands it to the rules, the limits
and the approvers as the double the checker typed, or each of them would fail
to evaluate (POLICY_FAILED) for every whole price."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.approving import approver

RULES = """
rules:
  - id: too-dear
    capabilities: ["orders.price"]
    effect: deny
    when: input.price * 1.2 > 12000.0
  - id: dear-needs-a-manager
    capabilities: ["orders.price"]
    effect: require_approval
    when: input.price * 1.0 > 5000.0
    approvers: '"manager" in approver.roles && input.price * 1.0 < 10000.0'
  - id: pricing
    capabilities: ["orders.price"]
    effect: allow
limits:
  - id: price-budget
    capabilities: ["orders.price"]
    key: actor.id
    budget: 1000000/day
    cost: input.price * 1.0
"""


class Priced(BaseModel):
    price: float
    weights: list[float] = []


class Quote(BaseModel):
    total: float


@pytest.fixture
def priced(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> Iterator[tuple[Plant, warden.Runtime]]:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "rules.yaml").write_text(RULES)
    plant = start_plane(folder)
    rt = warden.Runtime(plant.target, service="orders", token=ORDERS_TOKEN)

    @rt.capability("orders.price", input=Priced, output=Quote, side_effect="read")
    def price(inp: Priced, ctx: warden.Context) -> Quote:
        return Quote(total=inp.price + sum(inp.weights))

    rt.register()
    try:
        yield plant, rt
    finally:
        rt.close()


@pytest.mark.parametrize("price", [100, 100.0, 100.5])
def test_a_whole_number_reaches_the_rules_and_limits_as_a_double(
    priced: tuple[Plant, warden.Runtime], price: float
) -> None:
    plant, rt = priced
    env = rt.invoke("orders.price", {"price": price, "weights": [2]}, actor=plant.token())
    assert env.status == "succeeded", env
    (decision,) = plant.events(kind="decision", status="granted")
    assert decision["reason"] != "policy-error"
    denied = rt.invoke("orders.price", {"price": 20000}, actor=plant.token())
    assert (denied.status, denied.error and denied.error.code) == ("failed", "POLICY_DENIED")


def test_a_whole_number_reaches_the_approvers_as_a_double(
    priced: tuple[Plant, warden.Runtime],
) -> None:
    plant, rt = priced
    env = rt.invoke("orders.price", {"price": 6000}, actor=plant.token())
    assert env.status == "suspended", env
    with approver(plant) as approvals:
        approved = approvals.approve(env.approval_id or "")
    assert (approved.state, approved.decided_by) == ("approved", "mia")
    resumed = rt.invoke(
        "orders.price", {"price": 6000}, actor=plant.token(), approval_id=env.approval_id
    )
    assert resumed.status == "succeeded", resumed
    assert resumed.output == Quote(total=6000.0)
