"""The one decision every target is asked for, written once for all of them.

An actor with the role ``buyer`` in tenant ``acme`` creates an order: a
10-field input, five rules that apply to it (three allow, two deny that do
not fire, so the call is allowed), and 45 rules about other things, so each
engine holds a 50-rule policy set. Warden and Cerbos get the same five CEL
conditions, each in its own engine's names (``actor``/``input`` in Warden,
``request.principal``/``request.resource.attr`` in Cerbos).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, Field

SERVICE = "bench"
SERVICE_TOKEN = "bench-peers-token"  # noqa: S105 (a benchmark's own token)
# Signs the actor JWT; Warden and Cerbos both verify it with this key.
HS256_SECRET = "bench-only-secret-0123456789abcdef"  # noqa: S105
CAPABILITY = "bench.orders.create"
ACTION = "create"
RULES_IN_SET = 50

# A UUID of the right shape that no generator produces: the load generator
# writes a fresh id over these 36 bytes for every request.
ID_PLACEHOLDER = "00000000-0000-4000-8000-000000000000"

# The actor the call is made for (claims of its JWT; the principal for Cerbos).
ACTOR_ID = "bot-7"
ACTOR_ROLES = ["buyer"]
ACTOR_TENANT = "acme"


class OrderIn(BaseModel):
    """The capability's input: ten fields, each with a constraint to check."""

    order_id: Annotated[str, Field(min_length=1, max_length=32)]
    customer_id: Annotated[str, Field(min_length=1, max_length=64)]
    tenant: Annotated[str, Field(min_length=1, max_length=64)]
    amount: Annotated[int, Field(ge=0, description="In cents.")]
    currency: Literal["USD", "EUR", "GBP", "JPY"]
    quantity: Annotated[int, Field(gt=0, le=1000)]
    country: Annotated[str, Field(min_length=2, max_length=2)]
    express: bool
    channel: Literal["web", "mobile", "agent"]
    note: Annotated[str, Field(max_length=200)] = ""


class OrderOut(BaseModel):
    order_id: str


INPUT = {
    "order_id": "A-1001",
    "customer_id": "C-42",
    "tenant": "acme",
    "amount": 1250,
    "currency": "USD",
    "quantity": 3,
    "country": "FR",
    "express": False,
    "channel": "agent",
    "note": "gift wrap",
}
INPUT_JSON = json.dumps(INPUT, separators=(",", ":"))


@dataclass(frozen=True)
class Rule:
    """A rule in engine-neutral CEL: ``{roles}``, ``{tenant}`` and ``{input}``
    are filled with each engine's names."""

    name: str
    effect: Literal["allow", "deny"]
    when: str

    def warden(self) -> str:
        return self.when.format(roles="actor.roles", tenant="actor.tenant", input="input")

    def cerbos(self) -> str:
        return self.when.format(
            roles="request.principal.roles",
            tenant="request.principal.attr.tenant",
            input="request.resource.attr",
        )


MATCHING_RULES = [
    Rule("buyers-may-order", "allow", '"buyer" in {roles} && {input}.quantity <= 100'),
    Rule("same-tenant", "allow", "{tenant} == {input}.tenant"),
    Rule(
        "within-limits",
        "allow",
        '{input}.amount <= 500000 && {input}.currency in ["USD", "EUR", "GBP"]',
    ),
    Rule("embargo", "deny", '{input}.country in ["KP", "IR", "SY"]'),
    Rule("express-cap", "deny", "{input}.express && {input}.amount > 10000000"),
]

# The other 45 rules concern nine other kinds of thing, five rules each.
OTHER_KINDS = [f"misc{i}" for i in range((RULES_IN_SET - len(MATCHING_RULES)) // 5)]


def fresh_id(template: bytes) -> bytes:
    """The template with a new UUID in place of the placeholder, as the generator sends it."""
    return template.replace(ID_PLACEHOLDER.encode(), str(uuid.uuid4()).encode(), 1)


def placeholder_offset(template: bytes) -> int:
    """Where the id placeholder starts in a serialized request (it must occur once)."""
    needle = ID_PLACEHOLDER.encode()
    if template.count(needle) != 1:
        raise ValueError("the request must hold the id placeholder exactly once")
    return template.index(needle)
