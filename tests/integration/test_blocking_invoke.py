"""``invoke`` from a thread, of a synchronous handler, runs on that thread:
``Begin`` through a blocking connection, the handler on a handler thread,
the report handed to the outbox, and no event loop on the way
(``warden._execution.BlockingWaits``). The thread waits anyway; two switches
between threads per call (to the runtime's loop and back) are saved.

An async handler, a cancel token, or a registration still due take the
runtime's event loop, as ``ainvoke`` does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pydantic import BaseModel

import warden
from tests.conftest import ORDERS_TOKEN, Plant


class OrderRef(BaseModel):
    order_id: str


@contextmanager
def loop_held(rt: warden.Runtime) -> Iterator[None]:
    """The runtime's event loop busy (its thread held) until the block ends.

    A call in the block that needed the loop would wait for it: the hold would
    run out (after 10 s) before the block ended, and the block fails.
    """
    assert rt._loop_thread is not None, "the runtime's loop runs once it has registered"
    held, release = threading.Event(), threading.Event()
    ran_out: list[bool] = []

    def hold() -> None:
        held.set()
        ran_out.append(not release.wait(10))

    rt._loop_thread.loop.call_soon_threadsafe(hold)
    assert held.wait(5)
    try:
        yield
    finally:
        release.set()
    rt._loop_thread.run(asyncio.sleep(0))  # the hold has ended
    assert ran_out == [False], "a call waited for the runtime's event loop"


def test_invoke_of_a_synchronous_handler_needs_no_event_loop(orders: Any, plant: Plant) -> None:
    with loop_held(orders):
        env = orders.invoke("orders.get", {"order_id": "A1"}, actor=plant.token("bot-1"))
        assert env.status == "succeeded", env
        assert env.output.order_id == "A1"
        # The report goes from the outbox's own thread: it is taken meanwhile too.
        assert orders.flush(timeout_ms=10_000) == 0
    outcomes = plant.events(invocation_id=env.invocation_id, kind="outcome")
    assert [o["status"] for o in outcomes] == ["succeeded"]


def test_a_governed_failure_from_a_blocking_invoke_is_the_same_envelope(
    orders: Any, plant: Plant
) -> None:
    actor = plant.token("bot-1")
    with loop_held(orders):
        blocking = orders.invoke("orders.get", {"order_id": "Z9"}, actor=actor)
    on_the_loop = orders.invoke(
        "orders.get", {"order_id": "Z9"}, actor=actor, cancel=warden.CancelToken()
    )
    seen = []
    for env in (blocking, on_the_loop):
        assert env.status == "failed" and env.error is not None
        error = env.error
        seen.append(
            (error.code, error.public_message, error.retryable, env.executed_before_failure)
        )
    assert seen[0] == seen[1]
    assert seen[0][0] == "NO_SUCH_ORDER"


def test_an_interrupted_blocking_invoke_still_reports_its_outcome(plant: Plant) -> None:
    """A KeyboardInterrupt that reaches the waiting thread while the handler
    runs goes on to the caller, and the grant is closed out as cancelled."""
    rt = warden.Runtime(plant.target, service="orders", token=ORDERS_TOKEN)

    @rt.capability("orders.get", input=OrderRef, output=OrderRef, side_effect="read")
    def interrupted(inp: OrderRef, ctx: warden.Context) -> OrderRef:
        raise KeyboardInterrupt

    try:
        rt.register()
        with pytest.raises(KeyboardInterrupt):
            rt.invoke("orders.get", {"order_id": "A1"}, actor=plant.token("bot-1"))
        assert rt.flush(timeout_ms=10_000) == 0
    finally:
        rt.close()
    (decision,) = plant.events(kind="decision", status="granted")
    (outcome,) = plant.events(kind="outcome", invocation_id=decision["invocation_id"])
    assert outcome["status"] == "cancelled" and outcome["executed_before_failure"] == 1


def within(seconds: float, work: Any) -> Any:
    """What ``work()`` returns or raises, run on a thread of its own: a call
    that never returns fails the test instead of hanging the suite."""
    answer: list[Any] = []

    def run() -> None:
        try:
            answer.append(work())
        except BaseException as exc:
            answer.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=seconds)
    assert answer, f"{work} did not return within {seconds} s"
    return answer[0]


@pytest.mark.parametrize("interruption", [SystemExit(3), KeyboardInterrupt()])
def test_an_async_handler_that_exits_leaves_the_runtime_serving(
    plant: Plant, interruption: BaseException
) -> None:
    """An async handler runs on the runtime's event loop: what it raises that
    an event loop lets through (``sys.exit()``) reaches the caller of
    ``invoke``, its outcome is reported, and the loop goes on serving calls."""
    rt = warden.Runtime(plant.target, service="orders", token=ORDERS_TOKEN)

    @rt.capability("orders.get", input=OrderRef, output=OrderRef, side_effect="read")
    async def get(inp: OrderRef, ctx: warden.Context) -> OrderRef:
        if inp.order_id == "exit":
            raise interruption
        return inp

    def invoke(order_id: str) -> Any:
        return lambda: rt.invoke("orders.get", {"order_id": order_id}, actor=plant.token("bot-1"))

    within(20, rt.register)
    exited = within(20, invoke("exit"))
    served = within(20, invoke("A1"))
    assert within(20, lambda: rt.flush(timeout_ms=10_000)) == 0
    within(20, rt.close)
    assert exited is interruption
    assert isinstance(served, warden.Envelope) and served.status == "succeeded"
    stopped = plant.events(kind="decision", status="granted")[0]
    (outcome,) = plant.events(kind="outcome", invocation_id=stopped["invocation_id"])
    assert outcome["status"] == "cancelled" and outcome["executed_before_failure"] == 1


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync-handler", "async-handler"])
def test_an_interruption_ainvoke_raises_is_the_caller_s_to_catch(
    plant: Plant, asynchronous: bool
) -> None:
    """``ainvoke`` runs the call in a task of the caller's loop. A handler's
    KeyboardInterrupt reaches the ``await`` once, as the caller's own
    exception: caught there, the caller's loop goes on (asyncio would raise
    one that escapes a task out of the loop itself, a second time, past the
    caller's ``except``), and the outcome is reported as cancelled."""
    rt = warden.Runtime(plant.target, service="orders", token=ORDERS_TOKEN)

    def interrupted(inp: OrderRef, ctx: warden.Context) -> OrderRef:
        raise KeyboardInterrupt

    async def interrupted_async(inp: OrderRef, ctx: warden.Context) -> OrderRef:
        raise KeyboardInterrupt

    rt.capability("orders.get", input=OrderRef, output=OrderRef, side_effect="read")(
        interrupted_async if asynchronous else interrupted
    )

    async def main() -> str:
        await rt.aregister()
        try:
            await rt.ainvoke("orders.get", {"order_id": "A1"}, actor=plant.token("bot-1"))
        except KeyboardInterrupt:
            caught = "caught"
        await rt.aflush(timeout_ms=10_000)
        return caught

    try:
        assert within(20, lambda: asyncio.run(main())) == "caught"
    finally:
        rt.close()
    (decision,) = plant.events(kind="decision", status="granted")
    (outcome,) = plant.events(kind="outcome", invocation_id=decision["invocation_id"])
    assert outcome["status"] == "cancelled" and outcome["executed_before_failure"] == 1
