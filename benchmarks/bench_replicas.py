"""Begin on PostgreSQL with one and two replicas, beside SQLite with one plane.

Each plane is ``warden serve`` in its own process (one process each). The
PostgreSQL server is a throw-away one started by the benchmark on this
machine (``benchmarks/postgres.py``, fsync off: the figure is the plane's
cost, not the disk's; the SQLite store keeps its fsync). Begins are spread
round-robin over the replicas, ``IN_FLIGHT`` at a time, each answered with a
grant whose decision record is committed first (SI-3).

Quick mode: a few hundred Begins; no figure is judged (there is no target:
the figures are recorded in docs/performance.md).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from pydantic import BaseModel

import warden
from benchmarks import (
    free_port,
    percentile,
    start_plane,
    stop_plane,
    wait_until_serving,
    write_results,
)
from benchmarks.postgres import Server, binaries
from warden.shared.wire import SERVICE_TOKEN_METADATA
from warden.v1 import governor_pb2, governor_pb2_grpc
from warden_server.auth.actors import mint_token
from warden_server.config import load_config

IN_FLIGHT = 16
SERVICE_TOKEN = "replicas-token"  # noqa: S105 (a benchmark's own token)
POLICY = """rules:
  - id: members-may-call
    capabilities: ["bench.*"]
    effect: allow
    when: '"member" in actor.roles'
"""


class Order(BaseModel):
    amount: int


class Receipt(BaseModel):
    ok: bool


def run(quick: bool = False) -> bool:
    bin_dir = binaries()
    if bin_dir is None:
        print("bench_replicas: no PostgreSQL server binaries (apt-get install postgresql)")
        return False
    begins = 300 if quick else 4_000
    figures: dict[str, float] = {}
    server = Server(bin_dir)
    try:
        server.start()
        for name, store, replicas in [
            ("sqlite_1", "warden.db", 1),
            ("postgresql_1", server.fresh_database(), 1),
            ("postgresql_2", server.fresh_database(), 2),
        ]:
            result = _measure(store, replicas, begins)
            figures |= {f"{name}_{key}": value for key, value in result.items()}
    finally:
        server.stop()
    print(f"Begin, {IN_FLIGHT} in flight{' (quick)' if quick else ''}:")
    for name in ("sqlite_1", "postgresql_1", "postgresql_2"):
        print(
            f"  {name:14} {figures[f'{name}_begin_per_s']:8.0f} Begin/s   "
            f"p50 {figures[f'{name}_begin_p50_ms']:6.2f} ms   "
            f"p99 {figures[f'{name}_begin_p99_ms']:6.2f} ms"
        )
    write_results("replicas", figures, ok=True, quick=quick)
    return True


def _measure(store: str, replicas: int, begins: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="warden-bench-") as folder:
        root = Path(folder)
        (root / "policies").mkdir()
        (root / "policies" / "bench.yaml").write_text(POLICY)
        config_file = root / "warden.toml"
        config_file.write_text(
            f'[server]\nstore = "{store}"\npolicies = "policies"\nprocesses = 1\n\n'
            '[actors]\nhs256_secret = "bench-only-secret-0123456789abcdef"\n\n'
            f'[services.bench]\ntoken = "{SERVICE_TOKEN}"\nnamespaces = ["bench"]\n'
        )
        actor = mint_token(
            load_config(config_file, environ={}), subject="bot", roles=["member"], tenant="acme"
        )
        ports = [free_port() for _ in range(replicas)]
        planes = []
        try:
            for port in ports:
                planes.append(start_plane(config_file, port))
                wait_until_serving(f"127.0.0.1:{port}", planes[-1])
            targets = [f"127.0.0.1:{port}" for port in ports]
            _register(targets[0])
            return _begins(targets, actor, begins)
        finally:
            for plane in planes:
                stop_plane(plane)


def _register(target: str) -> None:
    with warden.Runtime(target, service="bench", token=SERVICE_TOKEN) as rt:

        @rt.capability("bench.order", input=Order, output=Receipt, side_effect="write")
        def order(inp: Order, ctx: warden.Context) -> Receipt:
            return Receipt(ok=True)

        rt.register()


def _begins(targets: list[str], actor: str, count: int) -> dict[str, float]:
    channels = [grpc.insecure_channel(target) for target in targets]
    stubs = [governor_pb2_grpc.GovernorStub(channel) for channel in channels]
    metadata = ((SERVICE_TOKEN_METADATA, SERVICE_TOKEN),)

    def begin(i: int) -> float:
        request = governor_pb2.BeginRequest(
            invocation_id=str(uuid.uuid4()),
            capability_id="bench.order",
            actor_token=actor,
            input_json='{"amount": 1}',
            surface="direct",
            context_json="{}",
            call_id=str(uuid.uuid4()),
            attempt=1,
        )
        started = time.perf_counter()
        response = stubs[i % len(stubs)].Begin(request, metadata=metadata, timeout=60)
        seconds = time.perf_counter() - started
        if response.WhichOneof("outcome") != "grant":
            raise RuntimeError(f"Begin was not granted: {response}")
        return seconds

    try:
        for i in range(20 * len(stubs)):
            begin(i)
        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            started = time.perf_counter()
            latencies = list(pool.map(begin, range(count)))
            elapsed = time.perf_counter() - started
    finally:
        for channel in channels:
            channel.close()
    return {
        "begin_per_s": count / elapsed,
        "begin_p50_ms": statistics.median(latencies) * 1e3,
        "begin_p99_ms": percentile(latencies, 99) * 1e3,
    }


if __name__ == "__main__":
    sys.exit(0 if run(quick="--quick" in sys.argv) else 1)
