"""An outcome is reported even when the plane is away after the grant: the
handler ran, so its ending must reach the audit log."""

from __future__ import annotations

import socket
import stat
import threading
from pathlib import Path

import warden
from tests.conftest import ORDERS_TOKEN, make_config
from tests.integration.lab import EchoIn, EchoOut, write_lab_policies
from warden_server.app import Server, serve
from warden_server.auth.actors import mint_token
from warden_server.plane import Plane
from warden_server.records.query import RecordFilter


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_an_outcome_reaches_a_plane_that_restarted_while_the_handler_ran(tmp_path: Path) -> None:
    """With the default grant key, which the plane made beside the store and
    signs with again after the restart, readable by its owner alone."""
    config = make_config(tmp_path, write_lab_policies(tmp_path / "policies"))
    listen = f"127.0.0.1:{free_port()}"
    servers: list[Server] = [serve(Plane.from_config(config), listen)]

    restarted = threading.Event()

    def restart_later() -> None:
        servers.append(serve(Plane.from_config(config), listen))
        restarted.set()

    rt = warden.Runtime(listen, service="orders", token=ORDERS_TOKEN)

    @rt.capability("orders.slow_write", input=EchoIn, output=EchoOut, side_effect="write")
    def slow_write(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        servers[0].stop(grace=0)  # the plane goes away while the handler runs...
        threading.Timer(0.15, restart_later).start()  # ...and comes back moments later
        return EchoOut(n=inp.n)

    try:
        env = rt.invoke("orders.slow_write", {"n": 3}, actor=mint_token(config, subject="bot-7"))
        assert env.status == "succeeded", (env.error, env.error and env.error.cause)
        # The restarted plane serves before all its processes have joined.
        assert restarted.wait(timeout=30)
        assert rt.flush(timeout_ms=30_000) == 0
        plane = servers[-1].plane
        records = [
            (r["kind"], r["status"])
            for r in plane.store.audit_records(RecordFilter(invocation_id=env.invocation_id))
        ]
        assert records == [("decision", "granted"), ("outcome", "succeeded")]
        assert plane.store.get_invocation(env.invocation_id).state == "completed"  # type: ignore[union-attr]
        key_file = tmp_path / "warden.db.grant-key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    finally:
        rt.close()
        for server in servers[1:]:
            server.stop(grace=0)
