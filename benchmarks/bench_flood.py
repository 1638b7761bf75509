"""An anonymous flood of the audit API, and what it costs everyone else.

A plane runs as ``warden serve`` in its own process. Flooding processes send
``Audit.Query`` without credentials, each with a large filter, at a steady
``FLOOD_RATE`` a second. Measured:

- the store's growth (the database file and its WAL) over a flood alone;
- the median of a legitimate ``Begin`` (a grant, one durable decision record)
  with no flood, and during the audit flood.

Baseline, measured in the same run: the median of ``Begin`` during a flood of
health checks of the same size and rate, which touch no store, so it
measures what sharing the machine's cores with the flooders costs alone. The
two floods alternate, ``ROUNDS`` windows each, and each round gives its own
ratio: a slow spell of a shared machine then lands on both sides of a round
rather than on one flood's only window.

Targets: the flood grows the store by at most ``GROWTH_TARGET_BYTES`` (a
refusal without credentials costs no record of its own), and ``Begin``'s
median during the audit flood is at most ``SLOWDOWN_TARGET`` times the
baseline (the audit flood takes no turn at the store's writer).

Quick mode floods for a second a phase and judges no figure.
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import BaseModel

import warden
from benchmarks import ECHO_POLICIES, percentile, plane, verdict, write_results
from warden.v1 import audit_pb2, audit_pb2_grpc, governor_pb2, governor_pb2_grpc
from warden_server.auth.actors import mint_token
from warden_server.config import load_config

GROWTH_TARGET_BYTES: Final = 1_000_000
SLOWDOWN_TARGET: Final = 2.0
FLOOD_SECONDS: Final = 15.0
"""How long each phase lasts: no flood, the audit flood alone (the store's
growth), then the health and the audit flood, each over ``ROUNDS`` windows."""
ROUNDS: Final = 3
QUICK_FLOOD_SECONDS: Final = 1.0
FLOODERS: Final = 2
FLOOD_THREADS: Final = 4
FLOOD_RATE: Final = 500
"""Flooding requests per second, all flooders together: about what the store's
writer managed, one fsynced record each, when every refusal was recorded."""
FILTER_BYTES: Final = 64_000
"""The size of each flooding request's filter (an actor id of this many characters)."""
SERVICE_TOKEN: Final = "bench-token"  # noqa: S105 (a benchmark's own token)

CONFIG = """
[server]
store = "warden.db"
policies = "policies"
workers = 16

[actors]
hs256_secret = "bench-only-secret-0123456789abcdef"

[services.bench]
token = "bench-token"
namespaces = ["bench"]
"""


def run(quick: bool = False) -> bool:
    with tempfile.TemporaryDirectory(prefix="warden-bench-") as folder:
        root = Path(folder)
        (root / "policies").mkdir()
        (root / "policies" / "bench.yaml").write_text(ECHO_POLICIES)
        (root / "warden.toml").write_text(CONFIG)
        config = load_config(root / "warden.toml", environ={})
        actor = mint_token(config, subject="b", roles=["member"])
        with plane(root / "warden.toml") as target:
            return _measure(target, actor, root / "warden.db", quick)


def _measure(target: str, actor: str, db: Path, quick: bool) -> bool:
    seconds = QUICK_FLOOD_SECONDS if quick else FLOOD_SECONDS
    with grpc.insecure_channel(target) as channel, _Flooders(target) as flood:
        governor = governor_pb2_grpc.GovernorStub(channel)
        runtime = _register(target)
        for _ in range(20):
            _begin(governor, actor)
        before = _begin_p50(governor, actor, seconds)
        size_before = _store_bytes(db)
        flood.send(AUDIT)
        time.sleep(seconds)
        grown = _store_bytes(db) - size_before
        requests = flood.sent.value
        rounds = [_round(flood, governor, actor, seconds / ROUNDS) for _ in range(ROUNDS)]
        runtime.close()
    control = statistics.median(health for health, _ in rounds)
    during = statistics.median(audit for _, audit in rounds)
    slowdown = statistics.median(audit / health for health, audit in rounds)
    ok_growth = grown <= GROWTH_TARGET_BYTES
    ok_begin = slowdown <= SLOWDOWN_TARGET
    kib = FILTER_BYTES // 1000
    print(
        f"flood: anonymous Audit.Query with a {kib} KB filter, {FLOOD_RATE}/s "
        f"from {FLOODERS} processes"
    )
    print(
        f"  flood requests              {requests:8d} in {seconds:g} s "
        f"({requests / seconds:,.0f}/s)"
    )
    print(
        f"  store growth                {grown / 1e6:8.3f} MB (target <= "
        f"{GROWTH_TARGET_BYTES / 1e6:g} MB)  {verdict(ok_growth, quick)}"
    )
    print(f"  Begin p50, no flood         {before * 1e3:8.2f} ms")
    print(
        "  Begin p50 by round, health flood / audit flood: "
        + ", ".join(f"{health * 1e3:.2f} / {audit * 1e3:.2f} ms" for health, audit in rounds)
    )
    print(f"  Begin p50, health flood     {control * 1e3:8.2f} ms (baseline: CPU shared alone)")
    print(
        f"  Begin p50, audit flood      {during * 1e3:8.2f} ms  ratio {slowdown:4.1f}x, "
        f"the median of the rounds' (target <= {SLOWDOWN_TARGET:g}x)  {verdict(ok_begin, quick)}"
    )
    ok = ok_growth and ok_begin
    figures = {
        "flood_seconds": seconds,
        "flood_requests": requests,
        "flood_requests_per_s": requests / seconds,
        "flood_rate_asked_per_s": FLOOD_RATE,
        "filter_bytes": FILTER_BYTES,
        "store_growth_bytes": grown,
        "store_growth_target_at_most": GROWTH_TARGET_BYTES,
        "begin_p50_no_flood_ms": before * 1e3,
        "begin_p50_health_flood_ms": control * 1e3,
        "begin_p50_audit_flood_ms": during * 1e3,
        "rounds": [
            {"begin_p50_health_flood_ms": health * 1e3, "begin_p50_audit_flood_ms": audit * 1e3}
            for health, audit in rounds
        ],
        "begin_slowdown_vs_health_flood": slowdown,
        "begin_slowdown_target_at_most": SLOWDOWN_TARGET,
        "ok": ok,
    }
    write_results("flood", figures, ok=ok, quick=quick)
    return requests > 0 if quick else ok


PAUSED, HEALTH, AUDIT = 0, 1, 2
"""What the flooders send: nothing, health checks (the control), audit queries."""


class _Flooders:
    """``FLOODERS`` processes of ``FLOOD_THREADS`` threads each, started once
    and paused, then sending what ``send`` says until the block ends."""

    def __init__(self, target: str) -> None:
        # Spawned, not forked: this process has gRPC threads running.
        processes = multiprocessing.get_context("spawn")
        self._stop = processes.Event()
        self._kind = processes.Value("i", PAUSED)
        self.sent = processes.Value("q", 0)
        """Requests sent since the last ``send``."""
        self._ready = processes.Value("i", 0)
        self._flooders = [
            processes.Process(
                target=_flood,
                args=(target, self._kind, self._stop, self.sent, self._ready),
                daemon=True,
            )
            for _ in range(FLOODERS)
        ]

    def __enter__(self) -> _Flooders:
        for flooder in self._flooders:
            flooder.start()
        while self._ready.value < FLOODERS * FLOOD_THREADS:  # every thread has its stubs
            time.sleep(0.05)
        return self

    def send(self, kind: int) -> None:
        """Send ``kind`` from now on, counting afresh."""
        with self.sent.get_lock():
            self._kind.value = kind
            self.sent.value = 0

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for flooder in self._flooders:
            flooder.join(timeout=10)


class Echo(BaseModel):
    n: int


def _register(target: str) -> warden.Runtime:
    rt = warden.Runtime(target, service="bench", token=SERVICE_TOKEN)

    @rt.capability("bench.echo", input=Echo, output=Echo, side_effect="read")
    def echo(inp: Echo, ctx: warden.Context) -> Echo:
        return inp

    rt.register()
    return rt


def _begin(governor: governor_pb2_grpc.GovernorStub, actor: str) -> float:
    request = governor_pb2.BeginRequest(
        invocation_id=str(uuid.uuid4()),
        capability_id="bench.echo",
        actor_token=actor,
        input_json='{"n": 1}',
    )
    started = time.perf_counter()
    answer = governor.Begin(request, metadata=(("x-warden-service-token", SERVICE_TOKEN),))
    elapsed = time.perf_counter() - started
    assert answer.WhichOneof("outcome") == "grant", answer
    return elapsed


def _round(
    flood: _Flooders, governor: governor_pb2_grpc.GovernorStub, actor: str, seconds: float
) -> tuple[float, float]:
    """``Begin``'s p50 during a window of the health flood, then one of the audit flood."""
    flood.send(HEALTH)
    health = _begin_p50(governor, actor, seconds)
    flood.send(AUDIT)
    return health, _begin_p50(governor, actor, seconds)


def _begin_p50(governor: governor_pb2_grpc.GovernorStub, actor: str, seconds: float) -> float:
    samples: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or len(samples) < 10:
        samples.append(_begin(governor, actor))
    return percentile(samples, 50)


def _flood(target: str, kind: Any, stop: Any, sent: Any, ready: Any) -> None:
    def loop() -> None:
        with grpc.insecure_channel(target) as channel:
            audit: Any = audit_pb2_grpc.AuditStub(channel).Query
            health: Any = health_pb2_grpc.HealthStub(channel).Check
            calls = {
                AUDIT: (
                    audit,
                    audit_pb2.QueryRequest(filter=audit_pb2.AuditFilter(actor="a" * FILTER_BYTES)),
                ),
                # The control: a request of the same size that touches no store.
                HEALTH: (health, health_pb2.HealthCheckRequest(service="a" * FILTER_BYTES)),
            }
            with ready.get_lock():
                ready.value += 1
            interval = FLOODERS * FLOOD_THREADS / FLOOD_RATE
            due = time.monotonic()
            while not stop.is_set():
                sending = kind.value
                if sending == PAUSED:
                    time.sleep(0.05)
                    due = time.monotonic()
                    continue
                query, request = calls[sending]
                with suppress(grpc.RpcError):
                    query(request, timeout=5)
                with sent.get_lock():
                    if kind.value == sending:  # not a request of the phase before
                        sent.value += 1
                due += interval
                time.sleep(max(0.0, due - time.monotonic()))

    threads = [threading.Thread(target=loop) for _ in range(FLOOD_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _store_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in (db, db.with_name(db.name + "-wal")) if p.exists())


if __name__ == "__main__":
    sys.exit(0 if run(quick="--quick" in sys.argv) else 1)
