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
