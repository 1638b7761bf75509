"""SI-5 sensitive data: a marker planted in a sensitive input field, a nested
sensitive output field and an exception message never reaches the store, the
logs or error details, on any path; model-hidden fields never reach a model."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.approving import approver
from tests.integration.guarantees.lab import Ledger, build_payments

HASH_KEY = "test-redaction-hash-key-0123"


def drive_every_path(rt: warden.Runtime, plant: Plant, marker: str) -> dict[str, warden.Envelope]:
    """Success, replay, denial, broken policy and message, approval (requested and resumed),
    timeout, output-invalid, an exception and a declared error, all carrying
    the marker as the card number."""
    actor = plant.token()

    def pay(amount: int = 10, note: str = "", **options: Any) -> warden.Envelope:
        card = {"number": marker, "holder": "Ada"}
        arguments = {"order_id": "A1", "amount": amount, "card": card, "note": note}
        return rt.invoke("orders.pay", arguments, actor=actor, **options)

    envelopes = {
        "success": pay(),
        "keyed": pay(11, idempotency_key="si5"),
        "replay": pay(11, idempotency_key="si5"),
        "denial": pay(5_000),
        "broken-policy": pay(note="cel"),
        "broken-message": pay(note="message"),
        "approval": pay(777),
        "timeout": pay(note="slow:300", timeout_ms=50, retry=warden.NO_RETRY),
        "output-invalid": pay(note="lie"),
        "exception": pay(note="explode"),
        "declared": pay(note="refuse"),
    }
    approval_id = envelopes["approval"].approval_id
    assert approval_id
    with approver(plant) as approvals:
        assert approvals.approve(approval_id).state == "approved"
    envelopes["approved"] = pay(777, approval_id=approval_id)
    return envelopes


def store_bytes(plant: Plant) -> bytes:
    """The SQLite file with its WAL and shared-memory files, byte for byte."""
    files = sorted(Path(plant.db_path).parent.glob(Path(plant.db_path).name + "*"))
    assert files
    return b"".join(f.read_bytes() for f in files)


@pytest.mark.single_process  # reads the spans and logs of the plane's own process
@pytest.mark.parametrize("evaluator", ["cel-python", "cel-cpp"])
@pytest.mark.parametrize("mode", ["mask", "keyed-hash"])
def test_si5_a_sensitive_marker_appears_nowhere(
    launch: Callable[..., Plant],
    ledger: Ledger,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    mode: str,
    evaluator: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    marker = f"MRK{uuid.uuid4().hex}"
    plant = launch(
        server={"evaluator": evaluator},
        redaction={"mode": mode, "hash_key": HASH_KEY},
        idempotency={"replay_key": "si5-replay-key-0123456789"},
    )
    assert plant.server.plane.policies.current().evaluator.name == evaluator
    spans = InMemorySpanExporter()
    plant.server.plane.telemetry.export_spans(SimpleSpanProcessor(spans))
    rt = build_payments(plant.target, ORDERS_TOKEN, ledger)
    try:
        envelopes = drive_every_path(rt, plant, marker)
    finally:
        rt.close()

    statuses = {
        name: (e.status, e.error.code if e.error else None) for name, e in envelopes.items()
    }
    assert statuses == {
        "success": ("succeeded", None),
        "keyed": ("succeeded", None),
        "replay": ("succeeded", None),
        "denial": ("failed", "POLICY_DENIED"),
        "broken-policy": ("failed", "POLICY_FAILED"),
        "broken-message": ("failed", "POLICY_DENIED"),
        "approval": ("suspended", "APPROVAL_REQUIRED"),
        "timeout": ("failed", "TIMEOUT"),
        "output-invalid": ("failed", "OUTPUT_INVALID"),
        "exception": ("failed", "INTERNAL_ERROR"),
        "declared": ("failed", "NOT_ELIGIBLE"),
        "approved": ("succeeded", None),
    }
    # The caller itself gets its output whole, and a replay returns it whole.
    assert envelopes["success"].output.receipt.token == f"tok-{marker}"
    assert envelopes["replay"].output == envelopes["keyed"].output
    # Error details cross to models: the handler's marker was scrubbed out of them.
    assert envelopes["declared"].error is not None
    assert envelopes["declared"].error.details == {"card": "[REDACTED]"}
    plant.server.stop(grace=0)

    assert marker.encode() not in store_bytes(plant)
    logged = caplog.text + "".join(capfd.readouterr())
    assert marker not in logged
    exported = "\n".join(span.to_json() for span in spans.get_finished_spans())
    assert "warden.policy" in exported, "the spans of every path were exported"
    assert marker not in exported
    assert marker not in plant.server.plane.telemetry.metrics.exposition().decode()
    # Error details and messages cross to models; output is the model's to
    # see unless marked model-hidden (sensitive is about records, not models).
    for env in envelopes.values():
        if env.error is not None:
            assert marker not in json.dumps(env.error.to_model())

    # What was stored instead: masks or keyed hashes, and the diagnostics kept
    # everything else a developer needs.
    rows = plant.rows()
    (explode,) = [
        r
        for r in rows
        if r["kind"] == "outcome" and r["invocation_id"] == envelopes["exception"].invocation_id
    ]
    assert explode["cause_message"] == "card [REDACTED] was declined by the bank"
    assert "Traceback" in explode["stack"] and "[REDACTED]" in explode["stack"]
    broken = next(r for r in rows if r["code"] == "POLICY_FAILED")
    # Both evaluators' errors are recorded in the same words, quoting no value.
    assert '"error":"field selection on a value that is not a map"' in broken["rules"]
    (message,) = [
        json.loads(r["rules"])
        for r in rows
        if r["kind"] == "decision"
        and r["invocation_id"] == envelopes["broken-message"].invocation_id
    ]
    (evaluated,) = [e for e in message["evaluated"] if e["id"] == "broken-message-rule"]
    assert evaluated["message_error"] == "field selection on a value that is not a map"
    cards = [json.loads(r["input"])["card"] for r in rows if r["input"] and r["kind"] == "decision"]
    (approval,) = plant.rows("SELECT input FROM approvals")
    cards.append(json.loads(approval["input"])["card"])
    if mode == "mask":
        assert set(map(json.dumps, cards)) == {'"[REDACTED]"'}
    else:
        assert all(c.startswith("hmac-sha256:") for c in cards)
        assert len(set(cards)) == 1, "equal values correlate under the keyed hash"


def test_si5_keyed_hashes_do_not_correlate_different_values(
    launch: Callable[..., Plant], ledger: Ledger
) -> None:
    plant = launch(redaction={"mode": "keyed-hash", "hash_key": HASH_KEY})
    rt = build_payments(plant.target, ORDERS_TOKEN, ledger)
    try:
        for number in ("4111111111111111", "5500000000000004"):
            card = {"number": number}
            rt.invoke(
                "orders.pay",
                {"order_id": "A1", "amount": 5, "card": card},
                actor=plant.token(),
            )
    finally:
        rt.close()
    stored = [json.loads(r["input"])["card"] for r in plant.events(kind="decision")]
    assert len(set(stored)) == 2


def test_si5_model_hidden_fields_never_reach_the_model(
    payments: warden.Runtime, pay_plant: Plant
) -> None:
    env = payments.invoke(
        "orders.pay",
        {"order_id": "A1", "amount": 5, "card": {"number": "4111111111111111"}},
        actor=pay_plant.token(),
    )
    assert env.status == "succeeded"
    assert env.output.internal_ref.startswith("ledger-")
    assert "internal_ref" not in env.model_output
    assert env.model_output["receipt"]["last4"] == "1111"


@pytest.mark.fixed_processes
def test_si5_sensitive_markings_come_from_pydantic_metadata() -> None:
    from tests.integration.guarantees.lab import PayIn, PayOut

    inp = PayIn.model_json_schema()
    out = PayOut.model_json_schema(mode="serialization")
    assert inp["properties"]["card"]["x-warden-sensitive"] is True
    assert out["$defs"]["Receipt"]["properties"]["token"]["x-warden-sensitive"] is True
    assert out["properties"]["internal_ref"]["x-warden-model-visible"] is False
