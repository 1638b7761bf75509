"""The orders service: three capabilities governed by Warden.

Run the plane (``make run``), then ``python examples/orders/service.py``: it
registers the capabilities and invokes each one for a development actor.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field

import warden

ORDERS = {"A1": {"total": 1250, "refundable": True}, "B2": {"total": 80, "refundable": False}}


class OrderRef(BaseModel):
    order_id: Annotated[str, Field(min_length=1, max_length=32)]


class Order(BaseModel):
    order_id: str
    total: int
    refundable: bool


class RefundIn(BaseModel):
    order_id: Annotated[str, Field(min_length=1, max_length=32)]
    amount: Annotated[int, Field(gt=0, description="In whole dollars.")]


class RefundOut(BaseModel):
    refund_id: str
    amount: int


class ExportIn(BaseModel):
    since: str


class ExportOut(BaseModel):
    orders: list[Order]


def build_runtime(target: str, token: str) -> warden.Runtime:
    """The orders service's runtime with its three capabilities."""
    rt = warden.Runtime(target, service="orders", token=token)

    @rt.capability(
        "orders.get",
        input=OrderRef,
        output=Order,
        side_effect="read",
        errors={"NO_SUCH_ORDER": "There is no order with this id."},
    )
    def get_order(inp: OrderRef, ctx: warden.Context) -> Order:
        """Look an order up by its id."""
        order = ORDERS.get(inp.order_id)
        if order is None:
            raise ctx.errors.NO_SUCH_ORDER()
        return Order(order_id=inp.order_id, total=order["total"], refundable=order["refundable"])

    @rt.capability(
        "orders.refund",
        input=RefundIn,
        output=RefundOut,
        side_effect="write",
        errors={"NOT_ELIGIBLE": "This order cannot be refunded."},
    )
    def refund(inp: RefundIn, ctx: warden.Context) -> RefundOut:
        """Refund part or all of an order."""
        order = ORDERS.get(inp.order_id)
        if order is None or not order["refundable"] or inp.amount > order["total"]:
            raise ctx.errors.NOT_ELIGIBLE()
        # The invocation id's tail is random; its head is the time (a UUIDv7).
        return RefundOut(refund_id=f"R-{ctx.invocation_id[-8:]}", amount=inp.amount)

    @rt.capability("orders.export", input=ExportIn, output=ExportOut, side_effect="read")
    def export(inp: ExportIn, ctx: warden.Context) -> ExportOut:
        """Export every order (administrators only: hidden from everyone else)."""
        return ExportOut(orders=[Order(order_id=k, **v) for k, v in ORDERS.items()])

    return rt


DEV_CONFIG = Path(__file__).resolve().parents[2] / "warden.toml"
"""The repository's development config, wherever the example is run from."""


def _dev_token(*args: str) -> str:
    """A development actor token, minted by ``warden token mint`` of this Python."""
    command = [sys.executable, "-m", "warden_server.cli", "token", "mint"]
    done = subprocess.run(
        [*command, "--config", str(DEV_CONFIG), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        why = done.stderr.strip().removeprefix("Error: ") or f"exit status {done.returncode}"
        raise SystemExit(f"cannot mint a development token: {why}")
    return done.stdout.strip()


def main() -> None:
    target = os.environ.get("WARDEN_TARGET", "127.0.0.1:50051")
    token = os.environ.get("WARDEN_SERVICE_ORDERS_TOKEN", "dev-only-orders-token")
    support = _dev_token("--sub", "bot-7", "--role", "support", "--tenant", "acme")
    with build_runtime(target, token) as rt:
        try:
            registered = rt.register()
        except warden.WardenError as exc:
            hint = " (is `make run` serving?)" if exc.transient else ""
            raise SystemExit(f"{exc}{hint}") from None
        for capability in registered:
            print(f"registered {capability.id} v{capability.version}")
        calls = [
            ("orders.get", {"order_id": "A1"}),
            ("orders.refund", {"order_id": "A1", "amount": 120}),
            ("orders.refund", {"order_id": "A1", "amount": 730}),
            ("orders.refund", {"order_id": "B2", "amount": 10}),
            ("orders.export", {"since": "2026-01-01"}),
        ]
        for capability, arguments in calls:
            envelope = rt.invoke(capability, arguments, actor=support)
            shown = (
                envelope.output.model_dump()
                if envelope.ok
                else envelope.error.to_model()
                if envelope.error
                else None
            )
            print(f"{capability} {arguments} -> {envelope.status}: {shown}")


if __name__ == "__main__":
    sys.exit(main())
