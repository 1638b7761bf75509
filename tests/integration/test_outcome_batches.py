"""The outbox sends the reports due together in one CompleteMany call, which
the plane commits together, and reports one by one to a plane without it. A
report waits a moment for the reports of the next calls, unless someone waits
for it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

import warden
from tests.conftest import ORDERS_TOKEN, ROOT, Plant
from tests.integration.lab import Lab, build_lab
from warden import _outbox

CALLS = 40
COMPLETE = "warden.v1.Governor/Complete"
COMPLETE_MANY = "warden.v1.Governor/CompleteMany"


async def invoke_at_once(rt: warden.Runtime, token: str, calls: int) -> list[warden.Envelope]:
    # Inputs the lab's rules allow: not 13 or 42, at most 100.
    allowed = [n for n in range(100) if n not in (13, 42)][:calls]
    return list(
        await asyncio.gather(*(rt.ainvoke("orders.echo", {"n": n}, actor=token) for n in allowed))
    )


@pytest.mark.single_process  # counts the calls one process's metrics saw
def test_reports_due_together_are_sent_in_few_calls_and_each_is_recorded_once(
    lab_plant: Plant, lab: Lab
) -> None:
    rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab)
    try:
        rt.register()
        envelopes = asyncio.run(invoke_at_once(rt, lab_plant.token(), CALLS))
        assert rt.flush(timeout_ms=10_000) == 0
    finally:
        rt.close()
    assert [e.status for e in envelopes] == ["succeeded"] * CALLS
    for envelope in envelopes:
        (outcome,) = lab_plant.events(kind="outcome", invocation_id=envelope.invocation_id)
        (decision,) = lab_plant.events(kind="decision", invocation_id=envelope.invocation_id)
        # Each report carried its own invocation's trace through the batch.
        assert outcome["trace_id"] == decision["trace_id"] is not None
    assert lab_plant.rpc_calls(COMPLETE) == 0
    assert 1 <= lab_plant.rpc_calls(COMPLETE_MANY) < CALLS


@pytest.mark.single_process  # counts the calls one process's metrics saw
def test_the_reports_of_calls_made_one_after_another_go_together(
    lab_plant: Plant, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One call at a time: each report waits for the next calls' (a long
    moment here, so that a slow machine cannot split them), and all go in one
    CompleteMany call instead of one call and one commit each."""
    monkeypatch.setattr(_outbox, "REPORT_DELAY_S", 3.0)
    wakes = count_wakes(monkeypatch)
    rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab)
    try:
        rt.register()
        envelopes = [rt.invoke("orders.echo", {"n": n}, actor=lab_plant.token()) for n in range(8)]
        assert lab_plant.rpc_calls(COMPLETE_MANY) == 0  # still waiting for company
        # Only the first report woke the outbox's thread; the others joined its wait.
        assert wakes == [1]
        assert rt.flush(timeout_ms=10_000) == 0
    finally:
        rt.close()
    assert [e.status for e in envelopes] == ["succeeded"] * 8
    assert lab_plant.rpc_calls(COMPLETE_MANY) == 1
    for envelope in envelopes:
        assert len(lab_plant.events(kind="outcome", invocation_id=envelope.invocation_id)) == 1


def count_wakes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the outbox's thread was woken to take in submitted reports."""
    wakes = [0]
    collect = _outbox.Outbox._collect

    def counted(self: _outbox.Outbox) -> None:
        wakes[0] += 1
        collect(self)

    monkeypatch.setattr(_outbox.Outbox, "_collect", counted)
    return wakes


def test_each_wait_for_company_ends_in_a_send_and_the_next_report_starts_another(
    lab_plant: Plant, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reports that join a wait are sent when it ends, without a flush; the
    first report after it wakes the outbox again."""
    monkeypatch.setattr(_outbox, "REPORT_DELAY_S", 1.0)
    wakes = count_wakes(monkeypatch)
    rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab)

    def recorded(envelopes: list[warden.Envelope]) -> bool:
        return all(
            lab_plant.events(kind="outcome", invocation_id=e.invocation_id) for e in envelopes
        )

    try:
        rt.register()
        for wait in (1, 2):
            envelopes = [
                rt.invoke("orders.echo", {"n": n}, actor=lab_plant.token()) for n in range(3)
            ]
            deadline = time.monotonic() + 10
            while not recorded(envelopes) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert recorded(envelopes), f"the reports of wait {wait} were not sent"
            assert wakes == [wait]
    finally:
        rt.close()


def test_a_report_someone_waits_for_goes_at_once(
    lab_plant: Plant, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flushing, or repeating an idempotency key whose call is still to be
    reported, sends what is due without waiting the moment out."""
    monkeypatch.setattr(_outbox, "REPORT_DELAY_S", 600.0)
    rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab, governance_timeout_ms=5_000)
    admin = lab_plant.token(roles=("admin",))
    try:
        rt.register()
        first = rt.invoke("orders.admin", {"n": 3}, actor=admin, idempotency_key="k-3")
        again = rt.invoke("orders.admin", {"n": 3}, actor=admin, idempotency_key="k-3")
        echoed = rt.invoke("orders.echo", {"n": 4}, actor=lab_plant.token())
        assert rt.flush(timeout_ms=5_000) == 0
    finally:
        rt.close()
    assert (first.status, again.status) == ("succeeded", "succeeded")
    assert again.replayed_from == first.invocation_id
    assert lab.count("admin") == 1
    assert len(lab_plant.events(kind="outcome", invocation_id=echoed.invocation_id)) == 1


@contextmanager
def older_plane(plane_target: str) -> Iterator[str]:
    """A plane from before CompleteMany: every call goes through to the real
    plane, except CompleteMany, which it does not know (UNIMPLEMENTED)."""
    channel = grpc.insecure_channel(plane_target)

    def forward(method: str) -> grpc.RpcMethodHandler[Any, Any]:
        upstream = channel.unary_unary(method)

        def call(request: bytes, context: grpc.ServicerContext) -> bytes:
            if method == "/" + COMPLETE_MANY:
                context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            try:
                answer: bytes = upstream(request, metadata=context.invocation_metadata())
            except grpc.RpcError as error:
                context.abort(error.code(), error.details() or "")
            return answer

        return grpc.unary_unary_rpc_method_handler(call)

    class Forwarding(grpc.GenericRpcHandler):
        def service(
            self, handler_call_details: grpc.HandlerCallDetails
        ) -> grpc.RpcMethodHandler[Any, Any] | None:
            return forward(handler_call_details.method)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((Forwarding(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)
        channel.close()


def test_a_plane_without_complete_many_gets_every_report_one_by_one(
    lab_plant: Plant, lab: Lab, start_plane: Callable[..., Plant]
) -> None:
    with older_plane(lab_plant.target) as target:
        rt = build_lab(target, ORDERS_TOKEN, lab)
        try:
            rt.register()
            envelopes = asyncio.run(invoke_at_once(rt, lab_plant.token(), 10))
            assert rt.flush(timeout_ms=10_000) == 0
        finally:
            rt.close()
    assert [e.status for e in envelopes] == ["succeeded"] * 10
    for envelope in envelopes:
        assert len(lab_plant.events(kind="outcome", invocation_id=envelope.invocation_id)) == 1


EXITS_WITHOUT_CLOSING = """
import sys
from tests.conftest import ORDERS_TOKEN
from tests.integration.lab import Lab, build_lab
from warden import _outbox

_outbox.REPORT_DELAY_S = 600.0  # nothing goes before the process ends
target, actor, outbox = sys.argv[1:]
rt = build_lab(target, ORDERS_TOKEN, Lab(), outbox=outbox)
rt.register()
print(rt.invoke("orders.echo", {"n": 5}, actor=actor).invocation_id)
"""


def test_a_process_that_ends_without_closing_its_runtime_sends_its_reports(
    lab_plant: Plant, tmp_path: Path
) -> None:
    ended = subprocess.run(
        [
            sys.executable,
            "-c",
            EXITS_WITHOUT_CLOSING,
            lab_plant.target,
            lab_plant.token(),
            str(tmp_path / "outbox.sqlite"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ended.returncode == 0, ended.stderr
    invocation_id = ended.stdout.strip()
    assert len(lab_plant.events(kind="outcome", invocation_id=invocation_id)) == 1
    assert "left" not in ended.stderr, ended.stderr
