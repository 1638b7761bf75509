"""A billing service whose charges above 500 need a manager's approval, with
a card number marked sensitive: what the console's tests approve."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field

import warden

POLICIES = """
rules:
  - id: charges-are-allowed-in-a-tenant
    capabilities: ["billing.charge"]
    effect: allow
    when: actor.tenant != ""
  - id: big-charges-need-a-manager
    capabilities: ["billing.charge"]
    effect: require_approval
    when: input.amount > 500
    message: "Charges above 500 need a manager's approval."
    approvers: '"manager" in approver.roles'
    ttl: 1h
  - id: no-charges-above-100000
    capabilities: ["billing.charge"]
    effect: deny
    when: input.amount > 100000
    message: "Charges above 100000 cannot be made here."
"""


class ChargeIn(BaseModel):
    customer: Annotated[str, Field(min_length=1, max_length=32)]
    amount: Annotated[int, Field(gt=0)]
    card: Annotated[str, warden.Sensitive]


class ChargeOut(BaseModel):
    charge_id: str
    amount: int


def write_policies(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "billing.yaml").write_text(POLICIES)
    return folder


def build_billing(target: str, token: str) -> warden.Runtime:
    rt = warden.Runtime(target, service="billing", token=token)

    @rt.capability("billing.charge", input=ChargeIn, output=ChargeOut, side_effect="write")
    def charge(inp: ChargeIn, ctx: warden.Context) -> ChargeOut:
        return ChargeOut(charge_id=f"ch-{inp.customer}", amount=inp.amount)

    return rt


CARD = "4111111111111111"


def charge(rt: warden.Runtime, token: str, amount: int, **extra: object) -> warden.Envelope:
    return rt.invoke(
        "billing.charge",
        {"customer": "c-17", "amount": amount, "card": CARD},
        actor=token,
        **extra,  # type: ignore[arg-type]
    )
