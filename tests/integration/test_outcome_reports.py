"""An outcome is reported even when the plane is briefly away after the grant:
the handler ran, so its ending must reach the audit log."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import warden
from tests.conftest import ORDERS_TOKEN, make_config
from tests.integration.lab import EchoIn, EchoOut, write_lab_policies
from warden_server.app import Server, serve
from warden_server.auth.actors import mint_token
from warden_server.plane import Plane


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_an_outcome_reaches_a_plane_that_restarted_while_the_handler_ran(tmp_path: Path) -> None:
    key = tmp_path / "grants.pem"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    base = make_config(tmp_path, write_lab_policies(tmp_path / "policies"))
    config = base.model_copy(
        update={"grants": base.grants.model_copy(update={"signing_key_file": str(key)})}
    )
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
        plane = servers[-1].plane
        records = [
            (r["kind"], r["status"])
            for r in plane.store.audit_rows("invocation_id = :i", {"i": env.invocation_id})
        ]
        assert records == [("decision", "granted"), ("outcome", "succeeded")]
        assert plane.store.get_invocation(env.invocation_id).state == "completed"  # type: ignore[union-attr]
    finally:
        rt.close()
        for server in servers[1:]:
            server.stop(grace=0)
