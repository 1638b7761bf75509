"""SI-3 under fire: a ``warden serve`` process killed with SIGKILL under
concurrent load has, after a restart, the decision record of every grant any
client received, and its chain still verifies."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from tests.conftest import ACTOR_SECRET, ORDERS_TOKEN
from tests.integration.lab import Lab, build_lab, write_lab_policies
from warden.v1 import governor_pb2, governor_pb2_grpc
from warden_server.auth.actors import mint_token
from warden_server.cli import main
from warden_server.config import load_config

# `warden serve` runs in a subprocess with its default process count, so
# these run once whatever counts WARDEN_TEST_PROCESSES lists.
pytestmark = pytest.mark.fixed_processes

CLIENTS = 8
GRANTS_BEFORE_THE_KILL = 150


class Serve:
    """``warden serve`` in a subprocess, and the address it reports."""

    def __init__(self, config: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "warden_server.cli", "serve", "--config", str(config)],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.target = self._wait_for_target()

    def _wait_for_target(self) -> str:
        assert self.process.stderr is not None
        found: list[str] = []

        def read() -> None:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                if "warden serving on " in line and not found:
                    found.append(line.split("warden serving on ")[1].split()[0])

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + 30
        while not found:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"warden serve did not start (exit {self.process.poll()})")
            time.sleep(0.02)
        return found[0]

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    policies = write_lab_policies(tmp_path / "policies")
    path = tmp_path / "warden.toml"
    path.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
store = "warden.db"
policies = "{policies}"

[actors]
hs256_secret = "{ACTOR_SECRET}"
issuer = "warden-test"

[services.orders]
token = "{ORDERS_TOKEN}"
namespaces = ["orders"]
"""
    )
    return path


@pytest.fixture
def serve(config: Path) -> Iterator[list[Serve]]:
    started: list[Serve] = []
    yield started
    for process in started:
        process.kill()


def load(target: str, token: str, grants: list[str], stop: threading.Event) -> None:
    """Begin as fast as possible until the plane dies or ``stop``; keep every grant."""
    with grpc.insecure_channel(target) as channel:
        stub = governor_pb2_grpc.GovernorStub(channel)
        while not stop.is_set():
            invocation_id = str(uuid.uuid4())
            try:
                response = stub.Begin(
                    governor_pb2.BeginRequest(
                        invocation_id=invocation_id,
                        capability_id="orders.echo",
                        actor_token=token,
                        input_json='{"n": 1}',
                    ),
                    metadata=(("x-warden-service-token", ORDERS_TOKEN),),
                    timeout=5,
                )
            except grpc.RpcError:
                return
            if response.WhichOneof("outcome") == "grant":
                grants.append(invocation_id)


def granted_decisions(db: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT invocation_id FROM audit_events WHERE kind = 'decision' AND status = 'granted'"
        )
        return {row[0] for row in rows}
    finally:
        conn.close()


@pytest.mark.heavy
def test_si3_every_grant_survives_a_sigkill_under_concurrent_load(
    config: Path, serve: list[Serve]
) -> None:
    plane = Serve(config)
    serve.append(plane)
    rt = build_lab(plane.target, ORDERS_TOKEN, Lab())
    try:
        rt.register()
    finally:
        rt.close()
    token = mint_token(load_config(config), subject="bot-7", roles=["support"], tenant="acme")

    grants: list[str] = []
    stop = threading.Event()
    clients = [
        threading.Thread(target=load, args=(plane.target, token, grants, stop))
        for _ in range(CLIENTS)
    ]
    for client in clients:
        client.start()
    deadline = time.monotonic() + 20
    while len(grants) < GRANTS_BEFORE_THE_KILL and time.monotonic() < deadline:
        time.sleep(0.01)
    plane.kill()  # mid-flight: clients are still sending
    stop.set()
    for client in clients:
        client.join(timeout=10)
    received = list(grants)
    assert len(received) >= GRANTS_BEFORE_THE_KILL, "the load never got going"

    restarted = Serve(config)
    serve.append(restarted)
    recorded = granted_decisions(config.parent / "warden.db")
    missing = [i for i in received if i not in recorded]
    assert not missing, f"{len(missing)} of {len(received)} grants have no decision record"

    # The restarted plane extends the same chain, and it verifies end to end.
    rt = build_lab(restarted.target, ORDERS_TOKEN, Lab())
    try:
        assert rt.invoke("orders.echo", {"n": 2}, actor=token).status == "succeeded"
    finally:
        rt.close()
    auditor = mint_token(load_config(config), subject="sec", roles=["auditor:all"])
    result = CliRunner().invoke(
        main, ["audit", "verify", "--target", restarted.target, "--token", auditor]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok: ")
