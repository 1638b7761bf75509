"""SI-11 honest retries, end to end: which failures the runtime retries on its
own, and that every attempt is its own audit record under one call id."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from typing import Any

import pytest

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.guarantees.lab import Ledger, build_payments

QUICK = warden.RetryPolicy(max_attempts=3, initial_backoff_ms=10, max_backoff_ms=40)


def flaky(key: str, failures: int, mode: str = "declared") -> dict[str, Any]:
    return {"key": key, "failures": failures, "mode": mode}


def attempts_of(plant: Plant, call_id: str) -> list[dict[str, Any]]:
    return [r for r in plant.rows() if r["call_id"] == call_id]


def test_si11_a_retryable_failure_of_a_read_is_retried_as_attempts_of_one_call(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    env = payments.invoke("orders.lookup", flaky("r1", 2), actor=pay_plant.token(), retry=QUICK)
    assert env.status == "succeeded" and env.output.attempts == 3
    assert env.attempt == 3 and env.call_id
    assert ledger.attempts["r1"] == 3

    rows = attempts_of(pay_plant, env.call_id)
    decisions = [r for r in rows if r["kind"] == "decision"]
    outcomes = [r for r in rows if r["kind"] == "outcome"]
    assert [r["attempt"] for r in decisions] == [1, 2, 3]
    assert [(r["attempt"], r["code"]) for r in outcomes] == [
        (1, "TRY_LATER"),
        (2, "TRY_LATER"),
        (3, None),
    ]
    assert len({r["invocation_id"] for r in decisions}) == 3
    assert env.invocation_id == decisions[-1]["invocation_id"]


@pytest.mark.fixed_processes
def test_a_retry_is_logged_with_why_the_attempt_failed(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """The runtime's own log (never the model's face) names the failed
    attempt's code and, where there is one, its cause."""
    caplog.set_level(logging.INFO, logger="warden")
    rt = build_payments("127.0.0.1:9", ORDERS_TOKEN, ledger, governance_timeout_ms=300)
    try:
        env = rt.invoke("orders.lookup", flaky("why", 0), actor="any", retry=QUICK)
    finally:
        rt.close()
    assert env.attempt == 3
    retried = [r for r in caplog.records if r.getMessage().startswith("retrying orders.lookup")]
    assert [r.warden_code for r in retried] == ["GOVERNANCE_UNAVAILABLE"] * 2  # type: ignore[attr-defined]
    cause = retried[0].warden_cause  # type: ignore[attr-defined]
    assert cause is not None
    assert (
        retried[0]
        .getMessage()
        .endswith(f"failed with GOVERNANCE_UNAVAILABLE ({type(cause).__name__}: {cause})")
    )


def test_the_ids_a_runtime_sends_grow_with_time(payments: warden.Runtime, pay_plant: Plant) -> None:
    """Invocation and call ids are UUIDv7, so the plane appends them at the end
    of its indexes (a random id costs a page per index once the store is large)."""
    env = payments.invoke("orders.lookup", flaky("ids", 2), actor=pay_plant.token(), retry=QUICK)
    assert env.status == "succeeded" and env.attempt == 3
    decisions = [r for r in attempts_of(pay_plant, env.call_id) if r["kind"] == "decision"]
    invocation_ids = [r["invocation_id"] for r in decisions]
    for text in (env.call_id, *invocation_ids):
        assert (uuid.UUID(text).version, uuid.UUID(text).variant) == (7, uuid.RFC_4122)
    assert invocation_ids == sorted(invocation_ids) and len(set(invocation_ids)) == 3
    assert abs(int(env.call_id.replace("-", "")[:12], 16) - time.time() * 1000) < 60_000


def test_si11_an_idempotent_capability_is_retried(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    env = payments.invoke("orders.sync", flaky("i1", 1), actor=pay_plant.token(), retry=QUICK)
    assert env.status == "succeeded" and env.attempt == 2
    assert ledger.attempts["i1"] == 2


def test_si11_a_write_without_an_idempotency_key_is_never_retried(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    env = payments.invoke("orders.charge", flaky("w1", 1), actor=pay_plant.token(), retry=QUICK)
    assert env.status == "failed" and env.error is not None
    assert env.error.code == "TRY_LATER" and env.error.retryable
    assert env.attempt == 1
    assert ledger.attempts["w1"] == 1
    assert len(attempts_of(pay_plant, env.call_id)) == 2  # one decision, one outcome


def test_si11_a_write_with_an_idempotency_key_is_retried(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    env = payments.invoke(
        "orders.charge",
        flaky("w2", 1),
        actor=pay_plant.token(),
        idempotency_key="charge-w2",
        retry=QUICK,
    )
    assert env.status == "succeeded" and env.attempt == 2
    assert ledger.attempts["w2"] == 2


def test_si11_never_after_executed_before_failure_for_a_write(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    env = payments.invoke(
        "orders.charge",
        flaky("w3", 1, mode="timeout"),
        actor=pay_plant.token(),
        idempotency_key="charge-w3",
        retry=QUICK,
    )
    assert env.status == "failed" and env.error is not None
    assert (env.error.code, env.error.retryable) == ("TIMEOUT", True)
    assert env.executed_before_failure
    assert env.attempt == 1
    assert ledger.attempts["w3"] == 1


def test_si11_an_idempotent_capability_is_retried_after_a_timeout(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    env = payments.invoke(
        "orders.sync", flaky("i2", 1, mode="timeout"), actor=pay_plant.token(), retry=QUICK
    )
    assert env.status == "succeeded" and env.attempt == 2
    (first,) = [
        r
        for r in attempts_of(pay_plant, env.call_id)
        if r["kind"] == "outcome" and r["attempt"] == 1
    ]
    assert first["code"] == "TIMEOUT" and first["executed_before_failure"] == 1


def test_si11_failures_that_would_recur_are_not_retried(
    payments: warden.Runtime, pay_plant: Plant
) -> None:
    token = pay_plant.token()
    invalid = payments.invoke("orders.lookup", {"key": 5}, actor=token, retry=QUICK)
    denied = payments.invoke(
        "orders.lookup", flaky("d", 0), actor=pay_plant.token(roles=("nobody",)), retry=QUICK
    )
    for env, code in ((invalid, "INPUT_INVALID"), (denied, "POLICY_DENIED")):
        assert env.error is not None and env.error.code == code
        assert env.attempt == 1


@pytest.mark.fixed_processes
def test_si11_governance_unavailable_is_retried_only_when_repeating_is_safe(
    ledger: Ledger,
) -> None:
    rt = build_payments("127.0.0.1:9", ORDERS_TOKEN, ledger, governance_timeout_ms=300)
    try:
        read = rt.invoke("orders.lookup", flaky("g", 0), actor="any", retry=QUICK)
        write = rt.invoke("orders.charge", flaky("g", 0), actor="any", retry=QUICK)
        keyed = rt.invoke(
            "orders.charge", flaky("g", 0), actor="any", idempotency_key="g-1", retry=QUICK
        )
    finally:
        rt.close()
    for env in (read, write, keyed):
        assert env.error is not None and env.error.code == "GOVERNANCE_UNAVAILABLE"
    assert (read.attempt, write.attempt, keyed.attempt) == (3, 1, 3)
    assert read.call_id != write.call_id != keyed.call_id
    assert ledger.attempts == {}


def test_si11_retries_are_configurable_per_runtime_and_per_call(
    pay_plant: Plant, ledger: Ledger
) -> None:
    rt = build_payments(pay_plant.target, ORDERS_TOKEN, ledger, retry=warden.NO_RETRY)
    try:
        once = rt.invoke("orders.lookup", flaky("c1", 1), actor=pay_plant.token())
        twice = rt.invoke(
            "orders.lookup",
            flaky("c2", 1),
            actor=pay_plant.token(),
            retry=warden.RetryPolicy(max_attempts=2, initial_backoff_ms=1, max_backoff_ms=1),
        )
    finally:
        rt.close()
    assert once.status == "failed" and once.attempt == 1
    assert twice.status == "succeeded" and twice.attempt == 2


def retrying_logged(caplog: pytest.LogCaptureFixture) -> bool:
    """Whether the runtime announced a retry: it is about to wait out the backoff."""
    return any(r.getMessage().startswith("retrying") for r in caplog.records)


SLOW = warden.RetryPolicy(max_attempts=5, initial_backoff_ms=5_000, max_backoff_ms=5_000)


def test_si11_cancelling_during_the_backoff_ends_the_call(
    pay_plant: Plant, ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="warden")

    async def scenario() -> warden.Envelope:
        rt = build_payments(pay_plant.target, ORDERS_TOKEN, ledger)
        try:
            await rt.aregister()
            task = asyncio.create_task(
                rt.ainvoke("orders.lookup", flaky("b", 5), actor=pay_plant.token(), retry=SLOW)
            )
            while not retrying_logged(caplog):
                await asyncio.sleep(0.005)
            task.cancel()
            return await task
        finally:
            await rt.aclose()
            rt.close()

    env = asyncio.run(scenario())
    assert env.status == "cancelled" and env.error is not None
    assert env.error.code == "CANCELLED"
    assert env.attempt == 1
    assert ledger.attempts["b"] == 1


def test_si11_a_cancel_token_stops_retrying(
    pay_plant: Plant, ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="warden")
    rt = build_payments(pay_plant.target, ORDERS_TOKEN, ledger)
    token = warden.CancelToken()

    def cancel_in_the_backoff() -> None:
        while not retrying_logged(caplog):
            time.sleep(0.005)
        token.cancel()

    canceller = threading.Thread(target=cancel_in_the_backoff)
    try:
        rt.register()
        canceller.start()
        env = rt.invoke(
            "orders.lookup", flaky("t", 5), actor=pay_plant.token(), retry=SLOW, cancel=token
        )
        canceller.join()
    finally:
        rt.close()
    assert env.status == "cancelled" and env.attempt == 1
    assert ledger.attempts["t"] == 1


def test_a_cancellation_once_the_outcome_is_known_keeps_the_outcome(
    pay_plant: Plant, ledger: Ledger
) -> None:
    async def scenario() -> warden.Envelope:
        rt = build_payments(pay_plant.target, ORDERS_TOKEN, ledger)
        try:
            await rt.aregister()
            task = asyncio.create_task(
                rt.ainvoke("orders.lookup", flaky("o", 5), actor=pay_plant.token(), retry=SLOW)
            )
            # The handler has answered; the outcome is on its way to the plane.
            while ledger.attempts.get("o", 0) == 0:
                await asyncio.sleep(0)
            while not pay_plant.events(kind="outcome"):
                await asyncio.sleep(0)
            task.cancel()
            return await task
        finally:
            await rt.aclose()
            rt.close()

    env = asyncio.run(scenario())
    # Cancelled either while the report was in flight (the outcome stands) or
    # in the backoff that followed; never another attempt.
    assert (env.status, env.error.code if env.error else None) in (
        ("failed", "TRY_LATER"),
        ("cancelled", "CANCELLED"),
    )
    assert env.attempt == 1 and ledger.attempts["o"] == 1
    assert len(pay_plant.events(kind="outcome")) == 1
