"""App middleware (pipeline step 6 on the service's side): authorizers run
after the grant and before the handler, and fail closed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.lab import EchoIn, EchoOut


class OrderIn(BaseModel):
    order_id: str
    owner: str


class Counter:
    def __init__(self) -> None:
        self.runs = 0


@pytest.fixture
def counter() -> Counter:
    return Counter()


@pytest.fixture
def guarded(lab_plant: Plant, counter: Counter) -> Iterator[warden.Runtime]:
    rt = warden.Runtime(lab_plant.target, service="orders", token=ORDERS_TOKEN)

    @rt.authorizer
    def no_weekend_bots(inp: BaseModel, ctx: warden.Context) -> bool:
        return ctx.actor.attrs.get("kind") != "weekend-bot"

    async def owner_only(inp: OrderIn, ctx: warden.Context) -> bool:
        await asyncio.sleep(0)  # an authorizer may await I/O
        return inp.owner == ctx.actor.id

    @rt.capability("orders.cancel", input=OrderIn, output=EchoOut, authorize=owner_only)
    def cancel(inp: OrderIn, ctx: warden.Context) -> EchoOut:
        counter.runs += 1
        return EchoOut(n=1)

    def explodes(inp: EchoIn, ctx: warden.Context) -> bool:
        raise RuntimeError("authorization backend down: ldap://10.0.0.7")

    @rt.capability("orders.fragile", input=EchoIn, output=EchoOut, authorize=explodes)
    def fragile(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        counter.runs += 1
        return EchoOut(n=inp.n)

    def says_why(inp: EchoIn, ctx: warden.Context) -> bool:
        raise warden.CapabilityError("FORBIDDEN", "Only the desk that opened it may close it.")

    @rt.capability("orders.close", input=EchoIn, output=EchoOut, authorize=says_why)
    def close(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        counter.runs += 1
        return EchoOut(n=inp.n)

    def forgets_to_return(inp: EchoIn, ctx: warden.Context) -> bool:
        return None  # type: ignore[return-value]

    @rt.capability("orders.sloppy", input=EchoIn, output=EchoOut, authorize=forgets_to_return)
    def sloppy(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        counter.runs += 1
        return EchoOut(n=inp.n)

    rt.register()
    yield rt
    rt.close()


def test_the_capability_authorizer_lets_the_owner_through(
    guarded: warden.Runtime, lab_plant: Plant, counter: Counter
) -> None:
    env = guarded.invoke(
        "orders.cancel", {"order_id": "A1", "owner": "alice"}, actor=lab_plant.token(sub="alice")
    )
    assert env.status == "succeeded" and counter.runs == 1


def test_a_refusing_authorizer_is_forbidden_and_the_handler_never_runs(
    guarded: warden.Runtime, lab_plant: Plant, counter: Counter
) -> None:
    env = guarded.invoke(
        "orders.cancel", {"order_id": "A1", "owner": "alice"}, actor=lab_plant.token(sub="bob")
    )
    assert env.status == "failed" and env.error is not None
    assert (env.error.code, env.error.stage) == ("FORBIDDEN", "authorization")
    assert env.error.to_model() == {
        "code": "FORBIDDEN",
        "message": "You are not allowed to perform this operation.",
        "retryable": False,
    }
    assert not env.executed_before_failure and counter.runs == 0
    (outcome,) = lab_plant.events(invocation_id=env.invocation_id, kind="outcome")
    assert (outcome["status"], outcome["code"], outcome["stage"]) == (
        "failed",
        "FORBIDDEN",
        "authorization",
    )
    assert outcome["executed_before_failure"] == 0
    assert "owner_only" in outcome["cause_message"]


def test_the_runtime_authorizer_runs_for_every_capability(
    guarded: warden.Runtime, lab_plant: Plant, counter: Counter
) -> None:
    bot = lab_plant.token(sub="alice", kind="weekend-bot")
    env = guarded.invoke("orders.cancel", {"order_id": "A1", "owner": "alice"}, actor=bot)
    assert env.error is not None and env.error.code == "FORBIDDEN"
    assert counter.runs == 0


def test_an_authorizer_that_breaks_fails_closed_and_conceals_why(
    guarded: warden.Runtime, lab_plant: Plant, counter: Counter
) -> None:
    env = guarded.invoke("orders.fragile", {"n": 1}, actor=lab_plant.token())
    assert env.error is not None and env.error.stage == "authorization"
    assert env.error.to_model() == {"code": "INTERNAL_ERROR", "message": "The operation failed."}
    assert counter.runs == 0
    (outcome,) = lab_plant.events(invocation_id=env.invocation_id, kind="outcome")
    assert "ldap://10.0.0.7" in outcome["cause_message"]


def test_an_authorizer_may_say_why_with_forbidden(
    guarded: warden.Runtime, lab_plant: Plant, counter: Counter
) -> None:
    env = guarded.invoke("orders.close", {"n": 1}, actor=lab_plant.token())
    assert env.error is not None
    assert env.error.to_model()["message"] == "Only the desk that opened it may close it."
    assert counter.runs == 0


def test_only_true_lets_the_handler_run(
    guarded: warden.Runtime, lab_plant: Plant, counter: Counter
) -> None:
    env = guarded.invoke("orders.sloppy", {"n": 1}, actor=lab_plant.token())
    assert env.error is not None and env.error.code == "FORBIDDEN"
    assert counter.runs == 0
