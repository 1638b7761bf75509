"""The servers under load, each started in its own process tree and checked
once from Python before the generator touches it.

A target is what the generator needs (port, method path, request template
with the id placeholder, headers) plus the process whose tree's CPU is the
server's cost. Warden and the echo floor live here; Cerbos in ``cerbos.py``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

import warden
from benchmarks import stop_plane
from benchmarks.peers import echo, workload
from warden.v1 import governor_pb2
from warden_server.auth.actors import mint_token
from warden_server.auth.services import SERVICE_TOKEN_METADATA
from warden_server.config import Config

BEGIN_PATH = "/warden.v1.Governor/Begin"

WARDEN_CONFIG = f"""
[server]
store = "warden.db"
policies = "policies"

[actors]
hs256_secret = "{workload.HS256_SECRET}"

[services.{workload.SERVICE}]
token = "{workload.SERVICE_TOKEN}"
namespaces = ["{workload.SERVICE}"]

[idempotency]
replay_key = "bench-only-replay-key-0123456789"
"""


class TargetError(Exception):
    """A server did not start, or answered the check call wrongly."""


@dataclass
class Target:
    """One server, as the load generator drives it."""

    name: str
    port: int
    path: str
    template: bytes
    process: subprocess.Popen[bytes]
    headers: list[str] = field(default_factory=list)

    @property
    def id_offset(self) -> int:
        return workload.placeholder_offset(self.template)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def call_once(target: Target) -> bytes:
    """One call with a fresh id, exactly the bytes the generator would send."""
    metadata = tuple(
        (name, value) for name, _, value in (h.partition(": ") for h in target.headers)
    )
    with grpc.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        # No (de)serializers: the generator's exact bytes go out, and come back raw.
        method = channel.unary_unary(target.path, None, None)
        answer: bytes = method(
            workload.fresh_id(target.template), metadata=metadata or None, timeout=5
        )
        return answer


def wait_until_answering(target: Target, log: Path, seconds: float = 30) -> bytes:
    """Call until the server answers; fail with its log if it exits or never does."""
    deadline = time.monotonic() + seconds
    while True:
        if target.process.poll() is not None:
            raise TargetError(f"{target.name} exited at start:\n{_tail(log)}")
        try:
            return call_once(target)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise TargetError(
                    f"{target.name} answered {error.code().name}: {error.details()}\n{_tail(log)}"
                ) from error
            time.sleep(0.1)


@contextmanager
def running(
    name: str, command: list[str], log: Path, make: Callable[[subprocess.Popen[bytes]], Target]
) -> Iterator[Target]:
    """Start ``command`` with its output in ``log``; stop its whole tree afterwards."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield make(process)
    finally:
        stop_plane(process)


def actor_token() -> str:
    """The actor's HS256 JWT, minted as ``warden token mint`` does."""
    config = Config.model_validate({"actors": {"hs256_secret": workload.HS256_SECRET}})
    return mint_token(
        config,
        subject=workload.ACTOR_ID,
        roles=workload.ACTOR_ROLES,
        tenant=workload.ACTOR_TENANT,
    )


@contextmanager
def warden_plane(folder: Path, processes: int, actor_token: str) -> Iterator[Target]:
    """``warden serve`` with audit on and a SQLite store in ``folder``; the
    capability registered through the SDK and one Begin checked for a grant."""
    root = folder / "warden"
    (root / "policies").mkdir(parents=True)
    (root / "policies" / "bench.yaml").write_text(_warden_policies())
    (root / "warden.toml").write_text(WARDEN_CONFIG)
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "warden_server.cli",
        "serve",
        "--config",
        str(root / "warden.toml"),
        "--listen",
        f"127.0.0.1:{port}",
        "--log-level",
        "WARNING",
    ]
    command += ["--processes", str(processes)]
    request = governor_pb2.BeginRequest(
        invocation_id=workload.ID_PLACEHOLDER,
        capability_id=workload.CAPABILITY,
        actor_token=actor_token,
        input_json=workload.INPUT_JSON,
    )

    def make(process: subprocess.Popen[bytes]) -> Target:
        return Target(
            name="warden",
            port=port,
            path=BEGIN_PATH,
            template=request.SerializeToString(),
            process=process,
            headers=[f"{SERVICE_TOKEN_METADATA}: {workload.SERVICE_TOKEN}"],
        )

    with running("warden", command, root / "serve.log", make) as target:
        _wait_for_health(target, root / "serve.log")
        # The SDK names the version it registered in every Begin; so does this.
        request.capability_version = _register(port)
        target.template = request.SerializeToString()
        answer = governor_pb2.BeginResponse.FromString(
            wait_until_answering(target, root / "serve.log")
        )
        if answer.WhichOneof("outcome") != "grant":
            raise TargetError(f"warden's Begin answered no grant: {answer}")
        yield target


@contextmanager
def echo_floor(folder: Path, processes: int, template: bytes) -> Iterator[Target]:
    """The bare ``grpc.aio`` echo in ``processes`` processes, fed Warden's request."""
    port = free_port()
    command = [sys.executable, "-m", echo.__name__, "--port", str(port)]
    command += ["--processes", str(processes)]

    def make(process: subprocess.Popen[bytes]) -> Target:
        return Target("echo", port, echo.PATH, template, process)

    log = folder / "echo.log"
    with running("echo", command, log, make) as target:
        answer = wait_until_answering(target, log)
        if len(answer) != len(template):
            raise TargetError("the echo answered something other than the request")
        yield target


def _warden_policies() -> str:
    lines = [
        "# Generated by benchmarks/peers: 5 rules about the capability, 45 about others.",
        "rules:",
    ]

    def rule(name: str, capability: str, effect: str, when: str) -> None:
        lines.extend(
            [
                f"  - id: {name}",
                f'    capabilities: ["{capability}"]',
                f"    effect: {effect}",
                f"    when: {_quoted(when)}",
            ]
        )

    for r in workload.MATCHING_RULES:
        rule(r.name, workload.CAPABILITY, r.effect, r.warden())
    for kind in workload.OTHER_KINDS:
        for r in workload.MATCHING_RULES:
            rule(f"{kind}-{r.name}", f"{workload.SERVICE}.{kind}", r.effect, r.warden())
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _wait_for_health(target: Target, log: Path, seconds: float = 30) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + seconds
    with grpc.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            if target.process.poll() is not None:
                raise TargetError(f"warden exited at start:\n{_tail(log)}")
            try:
                health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise TargetError(f"warden never became healthy:\n{_tail(log)}") from None
                time.sleep(0.1)


def _register(port: int) -> str:
    """Register the capability as a real service does, through the SDK; its version."""
    with warden.Runtime(
        f"127.0.0.1:{port}", service=workload.SERVICE, token=workload.SERVICE_TOKEN
    ) as rt:

        @rt.capability(
            workload.CAPABILITY,
            input=workload.OrderIn,
            output=workload.OrderOut,
            side_effect="write",
        )
        def create(inp: workload.OrderIn, ctx: warden.Context) -> workload.OrderOut:
            return workload.OrderOut(order_id=inp.order_id)

        (registered,) = rt.register()
        return registered.version


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
