"""Approval notifications: a real HTTP receiver gets a correctly signed POST
for each approval event, and gets it after all when the plane restarts while
a delivery is being retried."""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import warden
from tests.conftest import BILLING_TOKEN, make_config
from tests.console.billing import build_billing, charge
from tests.integration.test_outcome_restart import free_port
from warden_server.app import Server, serve
from warden_server.auth.actors import mint_token
from warden_server.config import Config
from warden_server.plane import Plane

SECRET = "webhook-secret-0123456789"
POLICIES = """
rules:
  - id: charges-are-allowed-in-a-tenant
    capabilities: ["billing.charge"]
    effect: allow
    when: actor.tenant != ""
  - id: big-charges-need-a-manager
    capabilities: ["billing.charge"]
    effect: require_approval
    when: input.amount > 500
    message: "Charges above 500 need a manager's approval."
    approvers: '"manager" in approver.roles'
    ttl: 1h
  - id: odd-charges-expire-at-once
    capabilities: ["billing.charge"]
    effect: require_approval
    when: input.amount == 13
    message: "Thirteen is odd."
    approvers: '"manager" in approver.roles'
    ttl: 1s
"""


@dataclass
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int

    @property
    def event(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


class Receiver:
    """A webhook endpoint: records every POST, answers ``status`` (500 to fail)."""

    def __init__(self) -> None:
        self.status = 200
        self.deliveries: queue.Queue[Delivery] = queue.Queue()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = receiver.status
                self.send_response(status)
                self.end_headers()
                receiver.deliveries.put(
                    Delivery(self.path, dict(self.headers.items()), body, status)
                )

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/warden"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def next(self, timeout_s: float = 30.0) -> Delivery:
        return self.deliveries.get(timeout=timeout_s)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


def signed_correctly(delivery: Delivery) -> bool:
    """The receiver's check, written from the documented scheme (not the plane's code)."""
    parts = dict(p.split("=", 1) for p in delivery.headers["X-Warden-Signature"].split(","))
    expected = hmac.new(
        SECRET.encode(), parts["t"].encode() + b"." + delivery.body, hashlib.sha256
    ).hexdigest()
    return hmac.compare_digest(expected, parts["v1"])


def notifying_config(tmp_path: Path, receiver: Receiver, **hook: Any) -> Config:
    folder = tmp_path / "policies"
    folder.mkdir(exist_ok=True)
    (folder / "billing.yaml").write_text(POLICIES)
    config = make_config(tmp_path, folder, approval_sweep_seconds=0.2)
    return config.model_validate(
        {
            **config.model_dump(),
            "notifications": {
                "webhooks": [{"url": receiver.url, "secret": SECRET, **hook}],
                "console_url": "https://console.example",
                "retry_initial_seconds": 0.2,
                "poll_seconds": 0.1,
            },
        }
    )


@pytest.fixture
def planes() -> Iterator[list[Server]]:
    running: list[Server] = []
    yield running
    for server in running:
        server.stop(grace=0)


def billing_on(target: str) -> warden.Runtime:
    rt = build_billing(target, BILLING_TOKEN)
    rt.register()
    return rt


def test_a_receiver_gets_a_signed_notification_for_each_approval_event(
    tmp_path: Path, receiver: Receiver, planes: list[Server]
) -> None:
    config = notifying_config(tmp_path, receiver)
    planes.append(serve(Plane.from_config(config), "127.0.0.1:0"))
    target = planes[-1].target
    requester = mint_token(config, subject="bot-7", roles=("support",), tenant="acme")
    manager = mint_token(config, subject="mia", roles=("manager",), tenant="acme")
    rt = billing_on(target)
    try:
        approved = charge(rt, requester, 730)
        denied = charge(rt, requester, 940)
        expired = charge(rt, requester, 13)
        with warden.Approvals(target, token=manager) as approvals:
            approvals.approve(approved.approval_id, reason="verified")
            approvals.deny(denied.approval_id, reason="no such customer")
        wanted = {
            ("approval.requested", approved.approval_id),
            ("approval.requested", denied.approval_id),
            ("approval.requested", expired.approval_id),
            ("approval.approved", approved.approval_id),
            ("approval.denied", denied.approval_id),
            ("approval.expired", expired.approval_id),
        }
        got: dict[tuple[str, str], Delivery] = {}
        while set(got) != wanted:
            delivery = receiver.next()
            got[(delivery.event["event"], delivery.event["approval_id"])] = delivery
    finally:
        rt.close()
    assert set(got) == wanted
    for (event, approval_id), delivery in got.items():
        assert delivery.path == "/hooks/warden"
        assert signed_correctly(delivery), event
        assert delivery.headers["X-Warden-Event"] == event
        assert delivery.event["url"] == f"https://console.example/approvals/{approval_id}"
        assert delivery.event["capability_id"] == "billing.charge"
        assert "4111111111111111" not in delivery.body.decode()  # arguments never travel
    requested = got[("approval.requested", approved.approval_id)].event
    assert requested["requester_id"] == "bot-7"
    assert requested["message"] == "Charges above 500 need a manager's approval."
    assert got[("approval.approved", approved.approval_id)].event["decided_by"] == "mia"
    assert got[("approval.denied", denied.approval_id)].event["reason"] == "no such customer"
    forged = Delivery("/", {**requested_headers(got)}, b'{"event": "approval.approved"}', 200)
    assert not signed_correctly(forged)


def requested_headers(got: dict[tuple[str, str], Delivery]) -> dict[str, str]:
    return next(iter(got.values())).headers


def _notifications(config: Config) -> list[tuple[int, str | None]]:
    """Each notification's attempts and when it was delivered."""
    conn = sqlite3.connect(config.store_path)
    try:
        return conn.execute("SELECT attempts, delivered_at FROM notifications").fetchall()
    finally:
        conn.close()


def _attempts(config: Config) -> int:
    """The attempts recorded for the store's one notification (0 before any)."""
    rows = _notifications(config)
    return int(rows[0][0]) if rows else 0


def test_a_notification_retried_when_the_plane_restarts_still_arrives_signed(
    tmp_path: Path, receiver: Receiver, planes: list[Server]
) -> None:
    config = notifying_config(tmp_path, receiver, events=["requested"])
    listen = f"127.0.0.1:{free_port()}"
    planes.append(serve(Plane.from_config(config), listen))
    requester = mint_token(config, subject="bot-7", roles=("support",), tenant="acme")
    receiver.status = 500  # the receiver is down: the delivery is retried
    rt = billing_on(listen)
    try:
        asked = charge(rt, requester, 730)
        first = receiver.next()
        assert first.answered == 500
        # The plane records the failed attempt once the receiver has answered
        # it: it stops between two attempts, not within the first.
        deadline = time.monotonic() + 10
        while _attempts(config) < 1:
            assert time.monotonic() < deadline, "the failed attempt was never recorded"
            time.sleep(0.01)
        planes[-1].stop(grace=0)
        receiver.status = 200
        planes.append(serve(Plane.from_config(config), listen))
        delivered = receiver.next()
        while delivered.answered != 200:
            delivered = receiver.next()
    finally:
        rt.close()
    assert signed_correctly(delivered)
    assert delivered.body == first.body
    assert delivered.headers["X-Warden-Delivery"] == first.headers["X-Warden-Delivery"]
    assert delivered.event["approval_id"] == asked.approval_id
    # The plane records the delivery once the receiver has answered it.
    deadline = time.monotonic() + 10
    while (rows := _notifications(config)) and rows[0][1] is None:
        assert time.monotonic() < deadline, f"the delivery was never recorded: {rows}"
        time.sleep(0.01)
    assert len(rows) == 1
    attempts, delivered_at = rows[0]
    assert attempts >= 2 and delivered_at is not None


def test_a_slack_webhook_gets_a_message_with_a_link_to_the_console(
    tmp_path: Path, receiver: Receiver, planes: list[Server]
) -> None:
    config = notifying_config(tmp_path, receiver, format="slack", events=["requested"])
    planes.append(serve(Plane.from_config(config), "127.0.0.1:0"))
    requester = mint_token(config, subject="bot-7", roles=("support",), tenant="acme")
    rt = billing_on(planes[-1].target)
    try:
        asked = charge(rt, requester, 730)
        delivery = receiver.next()
    finally:
        rt.close()
    assert signed_correctly(delivery)
    message = delivery.event
    link = f"<https://console.example/approvals/{asked.approval_id}|Open in the Warden console>"
    assert message["text"].endswith(link)
    assert "`billing.charge`" in message["text"]
    assert "requested by bot-7" in message["text"]
    assert message["blocks"][0]["type"] == "section"
