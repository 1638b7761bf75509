"""Time budgets and cancellation: per call never above the capability's, sync
and async handlers, cancel tokens for synchronous callers, and the plane
bounding its own work with deadlines."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any

import grpc
import pytest

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.guarantees.lab import Ledger, build_payments
from warden.v1 import governor_pb2, governor_pb2_grpc
from warden_server.auth.services import Service
from warden_server.pipeline.begin import begin
from warden_server.pipeline.context import BeginRequest
from warden_server.store import SQLiteStore, StoreError

SERVICE = (("x-warden-service-token", ORDERS_TOKEN),)
CARD = {"number": "4111111111111111"}


def pay(note: str = "", amount: int = 10) -> dict[str, Any]:
    return {"order_id": "A1", "amount": amount, "card": CARD, "note": note}


def granted_budget(plant: Plant, capability: str, arguments: Any, timeout_ms: int) -> int:
    with grpc.insecure_channel(plant.target) as channel:
        response = governor_pb2_grpc.GovernorStub(channel).Begin(
            governor_pb2.BeginRequest(
                invocation_id=str(uuid.uuid4()),
                capability_id=capability,
                actor_token=plant.token(),
                input_json=json.dumps(arguments),
                timeout_ms=timeout_ms,
            ),
            metadata=SERVICE,
        )
    assert response.WhichOneof("outcome") == "grant"
    return response.grant.timeout_ms


def test_a_call_budget_is_never_above_the_capability_budget(
    payments: warden.Runtime, pay_plant: Plant
) -> None:
    assert granted_budget(pay_plant, "orders.pay", pay(), 0) == 2_000
    assert granted_budget(pay_plant, "orders.pay", pay(), 150) == 150
    assert granted_budget(pay_plant, "orders.pay", pay(), 60_000) == 2_000


@pytest.mark.parametrize(
    ("capability", "arguments"),
    [
        ("orders.pay", pay("slow:400")),  # a synchronous handler
        ("orders.wait", {"key": "a", "failures": 400}),  # an async handler
    ],
)
def test_a_call_budget_bounds_sync_and_async_handlers(
    payments: warden.Runtime, pay_plant: Plant, capability: str, arguments: dict[str, Any]
) -> None:
    env = payments.invoke(
        capability, arguments, actor=pay_plant.token(), timeout_ms=50, retry=warden.NO_RETRY
    )
    assert env.error is not None and env.error.code == "TIMEOUT"
    assert env.executed_before_failure
    (outcome,) = pay_plant.events(invocation_id=env.invocation_id, kind="outcome")
    assert outcome["code"] == "TIMEOUT" and outcome["executed_before_failure"] == 1


def test_a_budget_that_is_not_positive_is_a_programming_error(
    payments: warden.Runtime, pay_plant: Plant
) -> None:
    with pytest.raises(warden.WardenError, match="timeout_ms must be positive"):
        payments.invoke("orders.pay", pay(), actor=pay_plant.token(), timeout_ms=0)


def test_an_unknown_surface_is_a_programming_error_not_a_plane_outage(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    with pytest.raises(warden.WardenError, match="unknown surface 'bogus'"):
        payments.invoke("orders.pay", pay(), actor=pay_plant.token(), surface="bogus")
    with pytest.raises(warden.WardenError, match="unknown surface 'slack'"):
        payments.discover(actor=pay_plant.token(), surface="slack")
    assert ledger.runs() == 0


@pytest.mark.parametrize(
    "context", [{"ratio": float("nan")}, {"at": object()}], ids=["nan", "not-json"]
)
def test_a_context_that_is_not_json_is_a_programming_error(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger, context: dict[str, object]
) -> None:
    """NaN would be written as null, a policy input nobody gave."""
    with pytest.raises(warden.WardenError, match="context is not JSON"):
        payments.invoke("orders.pay", pay(), actor=pay_plant.token(), context=context)
    with pytest.raises(warden.WardenError, match="context is not JSON"):
        payments.discover(actor=pay_plant.token(), context=context)
    assert ledger.runs() == 0


@pytest.mark.parametrize(
    ("capability", "arguments"),
    [
        ("orders.pay", pay("slow:1500")),
        ("orders.wait", {"key": "c", "failures": 1500}),
    ],
)
def test_a_cancel_token_cancels_a_running_call_from_another_thread(
    payments: warden.Runtime,
    pay_plant: Plant,
    ledger: Ledger,
    capability: str,
    arguments: dict[str, Any],
) -> None:
    token = warden.CancelToken()

    def cancel_once_started() -> None:
        ledger.started.wait(5)
        token.cancel()

    canceller = threading.Thread(target=cancel_once_started)
    canceller.start()
    env = payments.invoke(capability, arguments, actor=pay_plant.token(), cancel=token)
    canceller.join()
    assert env.status == "cancelled" and env.error is not None
    assert (env.error.code, env.error.stage) == ("CANCELLED", "cancellation")
    assert env.executed_before_failure
    (outcome,) = pay_plant.events(invocation_id=env.invocation_id, kind="outcome")
    assert outcome["status"] == "cancelled" and outcome["executed_before_failure"] == 1


def test_a_token_cancelled_before_the_call_runs_nothing(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    token = warden.CancelToken()
    token.cancel()
    env = payments.invoke("orders.pay", pay(), actor=pay_plant.token(), cancel=token)
    assert env.status == "cancelled" and env.invocation_id
    assert ledger.runs() == 0
    assert pay_plant.events(kind="decision") == []


def test_cancelling_while_begin_is_in_flight_closes_the_grant_out(
    pay_plant: Plant, ledger: Ledger
) -> None:
    async def scenario() -> warden.Envelope:
        rt = build_payments(pay_plant.target, ORDERS_TOKEN, ledger)
        try:
            await rt.aregister()
            task = asyncio.create_task(
                rt.ainvoke("orders.pay", pay(), actor=pay_plant.token(), idempotency_key="b-1")
            )
            await asyncio.sleep(0)  # the call has sent Begin and waits for the answer
            task.cancel()
            return await task
        finally:
            await rt.aclose()
            rt.close()

    env = asyncio.run(scenario())
    assert env.status == "cancelled"
    assert ledger.runs() == 0
    (outcome,) = pay_plant.events(invocation_id=env.invocation_id, kind="outcome")
    assert outcome["status"] == "cancelled" and outcome["executed_before_failure"] == 0
    # Nothing ran, so the key is free for the next attempt.
    assert pay_plant.rows("SELECT * FROM idempotency_keys") == []


def test_the_plane_never_grants_after_its_deadline(
    payments: warden.Runtime, pay_plant: Plant
) -> None:
    plane = pay_plant.server.plane
    invocation_id = str(uuid.uuid4())
    result = begin(
        plane,
        BeginRequest(
            service=Service(name="orders", namespaces=("orders",)),
            invocation_id=invocation_id,
            capability_id="orders.pay",
            capability_version="",
            actor_token=pay_plant.token(),
            input_json=json.dumps(pay()),
            surface="direct",
            context={},
            approval_id="",
            idempotency_key="",
            deadline=time.monotonic() - 0.001,
        ),
    )
    assert result.grant is None and result.failure is not None
    assert (result.failure.code, result.failure.retryable) == ("GOVERNANCE_UNAVAILABLE", True)
    (row,) = pay_plant.events(invocation_id=invocation_id)
    assert row["status"] == "failed" and row["reason"] == "plane-deadline-exceeded"
    assert pay_plant.rows("SELECT * FROM invocations") == []


def test_a_client_deadline_shorter_than_the_work_fails_closed(pay_plant: Plant) -> None:
    # gRPC usually ends the call at the client; on a loaded machine the plane's
    # answer can win that race, and then it must be a refusal: the deadline's,
    # or, when the plane read the deadline a moment before it passed, that of
    # its first stage (orders.pay is not registered here). Either way,
    # nothing is granted.
    with grpc.insecure_channel(pay_plant.target) as channel:
        stub = governor_pb2_grpc.GovernorStub(channel)
        try:
            answer = stub.Begin(
                governor_pb2.BeginRequest(
                    invocation_id=str(uuid.uuid4()),
                    capability_id="orders.pay",
                    actor_token=pay_plant.token(),
                    input_json=json.dumps(pay()),
                ),
                metadata=SERVICE,
                timeout=0.000_001,
            )
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            assert answer.WhichOneof("outcome") == "failure", answer
            assert answer.failure.code in {"GOVERNANCE_UNAVAILABLE", "CAPABILITY_NOT_FOUND"}
    assert pay_plant.rows("SELECT * FROM invocations") == []


@pytest.mark.fixed_processes
def test_store_work_not_started_by_its_deadline_never_runs(tmp_path: Any) -> None:
    store = SQLiteStore(tmp_path / "deadline.db")
    running = threading.Event()
    ran_late: list[bool] = []

    def slow(tx: Any) -> None:
        running.set()
        time.sleep(0.3)

    try:
        blocker = threading.Thread(target=lambda: store.transact(slow))
        blocker.start()
        assert running.wait(5)
        with pytest.raises(StoreError, match="deadline"):
            store.transact(lambda tx: ran_late.append(True), deadline=time.monotonic() + 0.05)
        blocker.join()
        assert ran_late == []
        assert store.transact(lambda tx: "on time", deadline=time.monotonic() + 5) == "on time"
    finally:
        store.close()
