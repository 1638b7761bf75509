"""Idempotency keys (SPEC §8): every answer a repeated key can get, end to end."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.approving import Clock, approver
from tests.integration.guarantees.lab import Ledger, PayOut, build_payments
from warden.v1 import governor_pb2, governor_pb2_grpc
from warden_server.pipeline.complete import UNDELIVERED

SERVICE = (("x-warden-service-token", ORDERS_TOKEN),)
CARD = {"number": "4111111111111111", "holder": "Ada"}


def pay_input(amount: int = 120, note: str = "", order_id: str = "A1") -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount, "card": CARD, "note": note}


def decision(plant: Plant, invocation_id: str) -> dict[str, Any]:
    (row,) = plant.events(invocation_id=invocation_id, kind="decision")
    return row


def key_row(plant: Plant, key: str) -> dict[str, Any] | None:
    rows = plant.rows("SELECT * FROM idempotency_keys WHERE key = ?", (key,))
    return rows[0] if rows else None


def raw_begin(plant: Plant, arguments: Any, key: str, actor: str) -> governor_pb2.BeginResponse:
    with grpc.insecure_channel(plant.target) as channel:
        return governor_pb2_grpc.GovernorStub(channel).Begin(
            governor_pb2.BeginRequest(
                invocation_id=str(uuid.uuid4()),
                capability_id="orders.pay",
                actor_token=actor,
                input_json=json.dumps(arguments),
                idempotency_key=key,
            ),
            metadata=SERVICE,
        )


@contextlib.contextmanager
def begin_held_at_its_commit(
    plant: Plant, channel: grpc.Channel, invocation_id: str, actor: str, key: str
) -> Iterator[grpc.Future[Any]]:
    """A ``Begin`` of ``orders.pay`` sent while this test holds the store's
    writer lock: yielded once its last step is taken (its record is queued in
    the same turn of the plane's loop, and waits for the lock); the lock is
    released when the block ends."""
    before = steps_taken(plant, "idempotency")
    turns = os.open(f"{plant.db_path}.writer-lock", os.O_RDWR)
    try:
        fcntl.flock(turns, fcntl.LOCK_EX)  # the plane's commits wait for this
        call = governor_pb2_grpc.GovernorStub(channel).Begin.future(
            governor_pb2.BeginRequest(
                invocation_id=invocation_id,
                capability_id="orders.pay",
                actor_token=actor,
                input_json=json.dumps(pay_input()),
                idempotency_key=key,
            ),
            metadata=SERVICE,
        )
        deadline = time.monotonic() + 10
        while steps_taken(plant, "idempotency") == before:
            assert time.monotonic() < deadline, "the Begin never reached its last step"
            time.sleep(0.01)
        yield call
    finally:
        os.close(turns)  # and with it the lock


def wait_until_closing(plant: Plant, failure: str) -> None:
    """Until a ``Begin`` of ``plant``'s ended before answering, and the plane
    set about closing its grant (``Plane.closing``)."""
    deadline = time.monotonic() + 20
    while not plant.server.plane.closing:
        assert time.monotonic() < deadline, failure
        time.sleep(0.01)


def steps_taken(plant: Plant, step: str) -> float:
    """How many times this (one-process) plane has run ``step`` of Begin."""
    return sum(
        sample.value
        for family in plant.server.plane.telemetry.metrics.registry.collect()
        for sample in family.samples
        if sample.name == "warden_stage_duration_seconds_count"
        and sample.labels.get("step") == step
    )


def together(n: int, call: Callable[[], warden.Envelope]) -> list[warden.Envelope]:
    """Make ``n`` calls at once, from ``n`` threads released together."""
    barrier = threading.Barrier(n)
    results: list[warden.Envelope] = []
    lock = threading.Lock()

    def run() -> None:
        barrier.wait()
        envelope = call()
        with lock:
            results.append(envelope)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert len(results) == n
    return results


def test_a_repeat_after_success_replays_the_outcome_without_running_the_handler(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    actor = pay_plant.token()
    first = payments.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-1")
    again = payments.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-1")

    assert first.status == again.status == "succeeded"
    assert ledger.runs() == 1
    assert again.replayed_from == first.invocation_id and first.replayed_from is None
    assert again.invocation_id != first.invocation_id
    assert isinstance(again.output, PayOut) and again.output == first.output
    assert again.output.internal_ref == first.output.internal_ref != ""
    assert "internal_ref" not in again.model_output
    assert again.model_output == first.model_output

    replayed = decision(pay_plant, again.invocation_id)
    assert replayed["status"] == "replayed"
    assert replayed["reason"] == f"idempotent-replay:{first.invocation_id}"
    assert not pay_plant.events(invocation_id=again.invocation_id, kind="outcome")
    held = key_row(pay_plant, "k-1")
    assert held is not None and held["state"] == "completed"
    assert held["invocation_id"] == first.invocation_id and held["status"] == "succeeded"


def test_the_same_key_with_another_input_is_a_conflict(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    actor = pay_plant.token()
    payments.invoke("orders.pay", pay_input(120), actor=actor, idempotency_key="k-2")
    env = payments.invoke("orders.pay", pay_input(121), actor=actor, idempotency_key="k-2")

    assert env.status == "failed" and env.error is not None
    assert env.error.to_model() == {
        "code": "IDEMPOTENCY_CONFLICT",
        "message": "This idempotency key was already used with different input.",
        "retryable": False,
    }
    assert env.error.stage == "execution"
    assert ledger.runs() == 1
    assert decision(pay_plant, env.invocation_id)["reason"].startswith("idempotency-conflict:")


def test_a_repeat_while_the_first_runs_is_in_progress_then_replays(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    actor = pay_plant.token()
    arguments = pay_input(note="block")
    results: list[warden.Envelope] = []
    first = threading.Thread(
        target=lambda: results.append(
            payments.invoke("orders.pay", arguments, actor=actor, idempotency_key="k-3")
        )
    )
    first.start()
    assert ledger.started.wait(5)

    busy = payments.invoke(
        "orders.pay", arguments, actor=actor, idempotency_key="k-3", retry=warden.NO_RETRY
    )
    assert busy.status == "failed" and busy.error is not None
    assert (busy.error.code, busy.error.retryable) == ("OPERATION_IN_PROGRESS", True)

    ledger.release.set()
    first.join(10)
    (done,) = results
    later = payments.invoke("orders.pay", arguments, actor=actor, idempotency_key="k-3")
    assert done.status == later.status == "succeeded"
    assert later.replayed_from == done.invocation_id
    assert ledger.runs() == 1


def test_two_concurrent_calls_with_one_key_run_the_handler_exactly_once(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    actor = pay_plant.token()
    arguments = pay_input(note="slow:300")
    patient = warden.RetryPolicy(max_attempts=20, initial_backoff_ms=50, max_backoff_ms=200)
    results = together(
        2,
        lambda: payments.invoke(
            "orders.pay", arguments, actor=actor, idempotency_key="k-4", retry=patient
        ),
    )

    assert ledger.runs() == 1
    assert [e.status for e in results] == ["succeeded", "succeeded"]
    ran, replayed = sorted(results, key=lambda e: e.replayed_from is not None)
    assert ran.replayed_from is None and replayed.replayed_from == ran.invocation_id
    assert replayed.output == ran.output
    # The loser learned the key was taken (in progress) before its retry replayed.
    losers = [
        r
        for r in pay_plant.events(kind="decision", call_id=replayed.call_id)
        if r["code"] == "OPERATION_IN_PROGRESS"
    ]
    assert losers and all(r["retryable"] == 1 for r in losers)


def test_many_concurrent_calls_with_one_key_grant_once(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    actor = pay_plant.token()
    arguments = pay_input(note="slow:200")
    results = together(
        8,
        lambda: payments.invoke(
            "orders.pay", arguments, actor=actor, idempotency_key="k-5", retry=warden.NO_RETRY
        ),
    )

    assert ledger.runs() == 1
    codes = sorted(e.error.code if e.error else e.status for e in results)
    assert codes.count("succeeded") + codes.count("OPERATION_IN_PROGRESS") == 8
    granted = pay_plant.events(kind="decision", status="granted")
    assert len(granted) == 1


@pytest.mark.parametrize(
    ("note", "code", "executed"),
    [("explode", "INTERNAL_ERROR", True), ("refuse", "NOT_ELIGIBLE", False)],
)
def test_a_recorded_failure_is_replayed_without_running_the_handler(
    payments: warden.Runtime,
    pay_plant: Plant,
    ledger: Ledger,
    note: str,
    code: str,
    executed: bool,
) -> None:
    actor = pay_plant.token()
    first = payments.invoke("orders.pay", pay_input(note=note), actor=actor, idempotency_key="k")
    again = payments.invoke("orders.pay", pay_input(note=note), actor=actor, idempotency_key="k")

    assert first.status == again.status == "failed"
    assert first.error is not None and again.error is not None
    assert first.error.code == code
    assert again.error.to_model() == first.error.to_model()
    assert again.executed_before_failure is first.executed_before_failure is executed
    assert again.replayed_from == first.invocation_id
    assert ledger.runs() == 1


def test_a_failure_before_the_handler_changed_anything_releases_the_key(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    actor = pay_plant.token()
    busy = payments.invoke(
        "orders.pay",
        pay_input(note="busy"),
        actor=actor,
        idempotency_key="k-6",
        retry=warden.NO_RETRY,
    )
    assert busy.error is not None and busy.error.code == "TRY_LATER" and busy.error.retryable
    assert key_row(pay_plant, "k-6") is None
    again = payments.invoke(
        "orders.pay",
        pay_input(note="busy"),
        actor=actor,
        idempotency_key="k-6",
        retry=warden.NO_RETRY,
    )
    assert again.replayed_from is None
    assert ledger.runs() == 2


def test_keys_expire_after_the_window(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger, clock: Clock
) -> None:
    actor = pay_plant.token()
    first = payments.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-7")
    clock.advance(hours=23, minutes=59)
    replayed = payments.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-7")
    assert replayed.replayed_from == first.invocation_id
    clock.advance(minutes=2)
    fresh = payments.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-7")
    assert fresh.status == "succeeded" and fresh.replayed_from is None
    assert ledger.runs() == 2
    held = key_row(pay_plant, "k-7")
    assert held is not None and held["invocation_id"] == fresh.invocation_id


def test_the_window_is_configurable(
    launch: Callable[..., Plant], clock: Clock, ledger: Ledger
) -> None:
    plant = launch(clock=clock, idempotency={"window": "90s"})
    rt = build_payments(plant.target, ORDERS_TOKEN, ledger)
    try:
        actor = plant.token()
        rt.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-8")
        clock.advance(seconds=91)
        fresh = rt.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-8")
    finally:
        rt.close()
    assert fresh.replayed_from is None
    assert ledger.runs() == 2


def test_an_outcome_that_never_arrived_is_ambiguous_and_never_rerun(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger, clock: Clock
) -> None:
    actor = pay_plant.token()
    # A service took the grant and died mid-handler: no Complete ever came.
    died = raw_begin(pay_plant, pay_input(), "k-9", actor)
    assert died.WhichOneof("outcome") == "grant"

    meanwhile = raw_begin(pay_plant, pay_input(), "k-9", actor)
    assert meanwhile.failure.code == "OPERATION_IN_PROGRESS"

    clock.advance(seconds=2 + 60 + 1)  # past the grant: time budget plus grant ttl
    env = payments.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-9")
    assert env.status == "failed" and env.error is not None
    assert env.error.to_model() == {
        "code": "OUTCOME_UNKNOWN",
        "message": "An earlier call with this idempotency key may have taken effect, "
        "but its outcome is unknown.",
        "retryable": False,
    }
    assert env.attempt == 1, "an ambiguous outcome is not retried"
    assert ledger.runs() == 0
    assert decision(pay_plant, env.invocation_id)["reason"] == (
        f"outcome-never-reported:{died.invocation_id}"
    )

    # The outcome arrives late after all: from then on it is what the key answers.
    with grpc.insecure_channel(pay_plant.target) as channel:
        governor_pb2_grpc.GovernorStub(channel).Complete(
            governor_pb2.CompleteRequest(
                invocation_id=died.invocation_id,
                grant_token=died.grant.token,
                status=governor_pb2.OUTCOME_STATUS_SUCCEEDED,
                output_json=json.dumps(
                    {
                        "payment_id": "P-late",
                        "amount": 120,
                        "receipt": {"last4": "1111", "token": "tok-late"},
                    }
                ),
            ),
            metadata=SERVICE,
        )
    late = payments.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-9")
    assert late.status == "succeeded" and late.replayed_from == died.invocation_id
    assert late.output.payment_id == "P-late"
    assert ledger.runs() == 0


def test_a_grant_whose_caller_left_before_the_answer_is_closed_and_its_key_released(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    """A caller that gives up on its ``Begin`` while the decision commits (it
    cancels, or its deadline passes) never receives the grant: the token is
    made after the commit, for the answer. The plane records the outcome at
    once (cancelled before the handler ran), so a retry with the key runs,
    instead of meeting OPERATION_IN_PROGRESS until the grant expires and
    OUTCOME_UNKNOWN after it."""
    actor = pay_plant.token()
    invocation_id = str(uuid.uuid4())
    with (
        grpc.insecure_channel(pay_plant.target) as channel,
        begin_held_at_its_commit(pay_plant, channel, invocation_id, actor, "k-gone") as call,
    ):
        assert call.cancel(), "the Begin answered while its commit could not happen"
        # Held until the plane has heard of it: a cancellation that reached it
        # only after the commit answered would find the answer sent, and the
        # plane cannot tell whether it arrived.
        wait_until_closing(pay_plant, "the plane never heard of the cancellation")
    deadline = time.monotonic() + 10
    while not pay_plant.events(invocation_id=invocation_id, kind="outcome"):
        assert time.monotonic() < deadline, "the undelivered grant was left open"
        time.sleep(0.05)
    assert decision(pay_plant, invocation_id)["status"] == "granted"
    (closed,) = pay_plant.events(invocation_id=invocation_id, kind="outcome")
    assert closed["status"] == "cancelled"
    assert (closed["code"], closed["stage"]) == ("CANCELLED", "cancellation")
    assert closed["executed_before_failure"] == 0 and closed["retryable"] == 1
    assert closed["cause_message"] == UNDELIVERED
    assert key_row(pay_plant, "k-gone") is None

    retried = payments.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-gone")
    assert retried.status == "succeeded" and retried.replayed_from is None
    assert ledger.runs() == 1


def test_a_grant_cut_short_by_the_plane_stopping_is_closed_before_the_store_closes(
    launch: Callable[..., Plant], ledger: Ledger
) -> None:
    """The same when the plane stops: its calls in flight are cancelled at the
    end of the grace, and the grants among them are closed before the store
    is."""
    plant = launch(server={"processes": 1})
    service = build_payments(plant.target, ORDERS_TOKEN, ledger)
    try:
        service.register()
    finally:
        service.close()
    invocation_id = str(uuid.uuid4())
    stopping = threading.Thread(target=plant.server.stop, kwargs={"grace": 0})
    with grpc.insecure_channel(plant.target) as channel:
        with begin_held_at_its_commit(
            plant, channel, invocation_id, plant.token(), "k-stop"
        ) as call:
            stopping.start()
            wait_until_closing(plant, "the stop did not cancel the call")
        stopping.join(30)
        assert not stopping.is_alive(), "the plane did not stop"
        with pytest.raises(grpc.RpcError):
            call.result(timeout=5)
    assert decision(plant, invocation_id)["status"] == "granted"
    outcomes = plant.events(invocation_id=invocation_id, kind="outcome")
    assert [(o["status"], o["code"], o["cause_message"]) for o in outcomes] == [
        ("cancelled", "CANCELLED", UNDELIVERED)
    ]
    assert key_row(plant, "k-stop") is None


def test_an_idempotent_resume_after_approval(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    actor = pay_plant.token()
    arguments = pay_input(777)
    suspended = payments.invoke("orders.pay", arguments, actor=actor, idempotency_key="k-10")
    assert suspended.status == "suspended" and suspended.approval_id
    assert key_row(pay_plant, "k-10") is None, "a suspension reserves nothing"
    with approver(pay_plant) as approvals:
        assert approvals.approve(suspended.approval_id).state == "approved"

    resumed = payments.invoke(
        "orders.pay",
        arguments,
        actor=actor,
        approval_id=suspended.approval_id,
        idempotency_key="k-10",
    )
    repeated = payments.invoke(
        "orders.pay",
        arguments,
        actor=actor,
        approval_id=suspended.approval_id,
        idempotency_key="k-10",
    )
    assert resumed.status == repeated.status == "succeeded"
    assert repeated.replayed_from == resumed.invocation_id
    assert repeated.output == resumed.output
    assert ledger.runs() == 1

    another_key = payments.invoke(
        "orders.pay",
        arguments,
        actor=actor,
        approval_id=suspended.approval_id,
        idempotency_key="k-11",
    )
    assert another_key.error is not None and another_key.error.code == "APPROVAL_DENIED"
    no_key = payments.invoke(
        "orders.pay", arguments, actor=actor, approval_id=suspended.approval_id
    )
    assert no_key.error is not None and no_key.error.code == "APPROVAL_DENIED"
    # The key's repeat without the approval id is the same call: replayed, not
    # put before an approver a second time.
    without_approval = payments.invoke("orders.pay", arguments, actor=actor, idempotency_key="k-10")
    assert without_approval.status == "succeeded"
    assert without_approval.replayed_from == resumed.invocation_id
    (requested,) = pay_plant.events(kind="approval", status="requested")
    assert requested["approval_id"] == suspended.approval_id
    assert ledger.runs() == 1


def test_a_granted_resume_is_not_retried_and_its_used_approval_says_so(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    """A resume whose handler fails, retryable, consumed its approval with its
    grant: the runtime does not retry it on its own (the retry could only be
    refused), the model gets the handler's failure, and presenting the used
    approval again says it was used, not that it was denied."""
    actor = pay_plant.token()
    arguments = pay_input(777, note="busy")
    suspended = payments.invoke("orders.pay", arguments, actor=actor, idempotency_key="k-20")
    assert suspended.status == "suspended" and suspended.approval_id
    with approver(pay_plant) as approvals:
        approvals.approve(suspended.approval_id)
    resumed = payments.invoke(
        "orders.pay",
        arguments,
        actor=actor,
        approval_id=suspended.approval_id,
        idempotency_key="k-20",
    )
    assert resumed.error is not None and resumed.error.code == "TRY_LATER"
    assert resumed.attempt == 1 and ledger.runs("pay") == 1
    again = payments.invoke(
        "orders.pay",
        arguments,
        actor=actor,
        approval_id=suspended.approval_id,
        idempotency_key="k-20",
    )
    assert again.error is not None
    assert again.error.to_model() == {
        "code": "APPROVAL_DENIED",
        "message": "This approval was used already; a new call needs a new approval.",
        "retryable": False,
    }
    assert ledger.runs("pay") == 1


def test_keys_are_scoped_to_the_actor(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    alice = payments.invoke(
        "orders.pay", pay_input(), actor=pay_plant.token(sub="alice"), idempotency_key="same"
    )
    bob = payments.invoke(
        "orders.pay", pay_input(), actor=pay_plant.token(sub="bob"), idempotency_key="same"
    )
    assert alice.status == bob.status == "succeeded"
    assert alice.replayed_from is None and bob.replayed_from is None
    assert ledger.runs() == 2


def test_si13_a_key_is_never_replayed_to_the_same_actor_id_under_another_tenant(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    first = payments.invoke(
        "orders.pay",
        pay_input(),
        actor=pay_plant.token(sub="sam", tenant="acme"),
        idempotency_key="shared",
    )
    other = payments.invoke(
        "orders.pay",
        pay_input(),
        actor=pay_plant.token(sub="sam", tenant="globex"),
        idempotency_key="shared",
    )
    assert first.status == "succeeded"
    assert other.status == "failed" and other.error is not None
    assert other.error.code == "IDEMPOTENCY_CONFLICT" and other.replayed_from is None
    assert other.output is None
    assert decision(pay_plant, other.invocation_id)["reason"] == (
        f"idempotency-other-tenant:{first.invocation_id}"
    )
    again = payments.invoke(
        "orders.pay",
        pay_input(),
        actor=pay_plant.token(sub="sam", tenant="acme"),
        idempotency_key="shared",
    )
    assert again.replayed_from == first.invocation_id  # its own tenant still replays
    assert ledger.runs() == 1


def test_replays_survive_a_restart_with_the_same_replay_key(
    launch: Callable[..., Plant], ledger: Ledger
) -> None:
    sealed = {"replay_key": "stable-replay-key-0123456789"}
    plant = launch(idempotency=sealed)
    rt = build_payments(plant.target, ORDERS_TOKEN, ledger)
    actor = plant.token()
    try:
        first = rt.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-12")
    finally:
        rt.close()
    plant.server.stop(grace=0)

    plant = launch(idempotency=sealed)
    rt = build_payments(plant.target, ORDERS_TOKEN, ledger)
    try:
        again = rt.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-12")
    finally:
        rt.close()
    assert again.replayed_from == first.invocation_id and again.output == first.output

    plant.server.stop(grace=0)
    plant = launch(idempotency={"replay_key": "another-replay-key-0123456789"})
    rt = build_payments(plant.target, ORDERS_TOKEN, ledger)
    try:
        unreadable = rt.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-12")
    finally:
        rt.close()
    assert unreadable.error is not None and unreadable.error.code == "OUTCOME_UNKNOWN"
    assert ledger.runs() == 1
    assert decision(plant, unreadable.invocation_id)["reason"] == (
        f"replay-unreadable:{first.invocation_id}"
    )


def test_replays_survive_a_restart_with_the_plane_s_own_replay_key(
    launch: Callable[..., Plant], ledger: Ledger
) -> None:
    """Without idempotency.replay_key the plane seals with a key it made once
    beside its store (owner-only), so a success recorded before a restart is
    replayed after it, not answered OUTCOME_UNKNOWN."""
    plant = launch()
    rt = build_payments(plant.target, ORDERS_TOKEN, ledger)
    actor = plant.token()
    try:
        first = rt.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-own")
    finally:
        rt.close()
    plant.server.stop(grace=0)
    key_file = plant.db_path.with_name(plant.db_path.name + ".replay-key")
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600

    plant = launch()
    rt = build_payments(plant.target, ORDERS_TOKEN, ledger)
    try:
        again = rt.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k-own")
    finally:
        rt.close()
    assert again.status == "succeeded", again
    assert again.replayed_from == first.invocation_id and again.output == first.output
    assert ledger.runs() == 1


def test_an_overlong_key_is_refused_and_recorded(pay_plant: Plant) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        raw_begin(pay_plant, pay_input(), "k" * 256, pay_plant.token())
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "idempotency_key is longer than 255" in (raised.value.details() or "")
    (row,) = pay_plant.events(kind="decision", status="rejected")
    assert "idempotency_key" in row["reason"]


def test_the_sdk_refuses_an_overlong_key_before_asking_the_plane(
    payments: warden.Runtime, pay_plant: Plant, ledger: Ledger
) -> None:
    """A key the plane would refuse is the caller's mistake, raised at the call
    like a budget that is not positive, not an envelope that tells the model
    to try again later; a key of exactly the limit is governed as usual."""
    actor = pay_plant.token()
    with pytest.raises(warden.WardenError, match="idempotency_key is longer than 255 characters"):
        payments.invoke("orders.pay", pay_input(), actor=actor, idempotency_key="k" * 256)
    assert not pay_plant.events(kind="decision")
    assert ledger.runs() == 0
    at_the_limit = payments.invoke(
        "orders.pay", pay_input(), actor=actor, idempotency_key="k" * 255
    )
    assert at_the_limit.status == "succeeded" and ledger.runs() == 1
