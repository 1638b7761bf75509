"""A payments service for the execution guarantees: idempotency, retries, time
budgets, cancellation and sensitive data."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

import warden

GUARANTEES_POLICIES = """
rules:
  - id: allow-orders
    capabilities: ["orders.*"]
    effect: allow
    when: '!("nobody" in actor.roles)'
  - id: big-payments-denied
    capabilities: ["orders.pay"]
    effect: deny
    when: input.amount > 1000
    message: "Pay at most 1000."
  - id: broken-card-rule
    capabilities: ["orders.pay"]
    effect: deny
    # Breaks on purpose for note "cel": the CEL error quotes the card number.
    # dyn() keeps the policy checker from refusing the field a string lacks.
    when: has(input.note) && input.note == "cel" && dyn(input.card.number).digits == 1
  - id: broken-message-rule
    capabilities: ["orders.pay"]
    effect: deny
    # Breaks on purpose for note "message": the message_expr error quotes the card number.
    when: has(input.note) && input.note == "message"
    message_expr: '"card " + dyn(input.card.number).digits'
    message: "This payment cannot be made."
  - id: lucky-payments-need-approval
    capabilities: ["orders.pay"]
    effect: require_approval
    when: input.amount == 777
    message: "A payment of 777 needs a manager."
    approvers: '"manager" in approver.roles'
"""


class Card(BaseModel):
    number: str
    holder: str = ""


class PayIn(BaseModel):
    order_id: str
    amount: Annotated[int, Field(gt=0)]
    card: Annotated[Card, warden.Sensitive]
    note: str = ""


class Receipt(BaseModel):
    last4: str
    token: Annotated[str, warden.Sensitive]


class PayOut(BaseModel):
    payment_id: str
    amount: int
    receipt: Receipt
    internal_ref: Annotated[str, warden.ModelHidden] = ""


class CountIn(BaseModel):
    key: str
    failures: int = 0
    """How many attempts fail (retryably) before one succeeds."""
    mode: str = "declared"


class CountOut(BaseModel):
    key: str
    attempts: int


class Ledger:
    """What the service did, so tests can prove what ran and how often."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.payments: list[PayIn] = []
        self.attempts: dict[str, int] = {}
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def paid(self, inp: PayIn) -> int:
        with self.lock:
            self.payments.append(inp)
            return len(self.payments)

    def runs(self, key: str = "pay") -> int:
        return self.attempts.get(key, 0)

    def attempt(self, key: str) -> int:
        with self.lock:
            self.attempts[key] = self.attempts.get(key, 0) + 1
            return self.attempts[key]


def write_guarantees_policies(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "guarantees.yaml").write_text(GUARANTEES_POLICIES)
    return folder


def build_payments(target: str, token: str, ledger: Ledger, **runtime: Any) -> warden.Runtime:
    rt = warden.Runtime(target, service="orders", token=token, **runtime)

    @rt.capability(
        "orders.pay",
        input=PayIn,
        output=PayOut,
        side_effect="write",
        timeout_ms=2_000,
        errors={
            "NOT_ELIGIBLE": "This order cannot be paid.",
            "TRY_LATER": {"message": "The bank is busy; try again.", "retryable": True},
        },
    )
    def pay(inp: PayIn, ctx: warden.Context) -> PayOut:
        ledger.attempt("pay")
        ledger.started.set()
        note = inp.note
        if note == "block":
            ledger.release.wait(10)
        if note.startswith("slow:"):
            time.sleep(int(note.removeprefix("slow:")) / 1000)
        if note == "explode":
            raise RuntimeError(f"card {inp.card.number} was declined by the bank")
        if note == "refuse":
            raise ctx.errors.NOT_ELIGIBLE(details={"card": inp.card.number})
        if note == "busy":
            raise ctx.errors.TRY_LATER()
        count = ledger.paid(inp)
        if note == "lie":
            return {  # type: ignore[return-value]
                "payment_id": "P-lie",
                "amount": "many",
                "receipt": {"last4": "0000", "token": inp.card.number},
            }
        ledger.finished.set()
        return PayOut(
            payment_id=f"P-{count}-{uuid.uuid4().hex[:6]}",
            amount=inp.amount,
            receipt=Receipt(last4=inp.card.number[-4:], token=f"tok-{inp.card.number}"),
            internal_ref=f"ledger-{count}",
        )

    # The same flaky work under each side-effect class, for the retry rules.
    flaky: dict[str, Any] = {
        "input": CountIn,
        "output": CountOut,
        "timeout_ms": 300,
        "errors": {"TRY_LATER": {"message": "Busy; try again.", "retryable": True}},
    }

    @rt.capability("orders.lookup", side_effect="read", **flaky)
    def lookup(inp: CountIn, ctx: warden.Context) -> CountOut:
        return _flaky(ledger, inp, ctx)

    @rt.capability("orders.charge", side_effect="write", **flaky)
    def charge(inp: CountIn, ctx: warden.Context) -> CountOut:
        return _flaky(ledger, inp, ctx)

    @rt.capability("orders.sync", side_effect="idempotent", **flaky)
    async def sync(inp: CountIn, ctx: warden.Context) -> CountOut:
        if inp.mode == "timeout" and ledger.attempts.get(inp.key, 0) < inp.failures:
            ledger.attempt(inp.key)
            await asyncio.sleep(1.0)
        return _flaky(ledger, inp, ctx)

    @rt.capability(
        "orders.wait", input=CountIn, output=CountOut, side_effect="read", timeout_ms=5_000
    )
    async def wait(inp: CountIn, ctx: warden.Context) -> CountOut:
        ledger.attempt(inp.key)
        ledger.started.set()
        await asyncio.sleep(inp.failures / 1000)
        return CountOut(key=inp.key, attempts=0)

    return rt


def _flaky(ledger: Ledger, inp: CountIn, ctx: warden.Context) -> CountOut:
    attempt = ledger.attempt(inp.key)
    if attempt <= inp.failures:
        if inp.mode == "timeout":
            time.sleep(1.0)  # beyond the 300 ms budget: the handler started, then timed out
        raise ctx.errors.TRY_LATER()
    return CountOut(key=inp.key, attempts=attempt)
