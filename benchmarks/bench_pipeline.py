"""The whole governed call, end to end: ``Runtime.invoke`` through a real plane
(Begin with every stage, the handler, Complete, two durable audit records).
The plane runs as ``warden serve`` in its own process, as it does in production.

Baseline, measured in the same run on the same server: a bare gRPC health
check, the cheapest round trip the plane answers. Targets:

- one governed call costs at most ``SEQUENTIAL_TARGET`` bare round trips;
- eight concurrent callers get at least ``CONCURRENT_TARGET`` times the
  throughput of one caller: durable writes are group-committed, not queued
  one fsync at a time. Caller and plane are CPU-bound Python processes, so on
  two cores the ceiling is about 2x; runs here measure 1.4x to 1.6x.

Quick mode makes a few dozen calls and judges no figure.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import BaseModel

import warden
from benchmarks import ECHO_POLICIES, plane, verdict, write_results
from warden_server.auth.actors import mint_token
from warden_server.config import load_config

SEQUENTIAL_TARGET = 60.0
CONCURRENT_TARGET = 1.2
CALLS = 300
QUICK_CALLS = 30
THREADS = 8


class Echo(BaseModel):
    n: int
    note: str = ""


def run(quick: bool = False) -> bool:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "policies").mkdir()
        (root / "policies" / "bench.yaml").write_text(ECHO_POLICIES)
        (root / "warden.toml").write_text(CONFIG)
        config = load_config(root / "warden.toml", environ={})
        actor = mint_token(config, subject="b", roles=["member"])
        with plane(root / "warden.toml") as target:
            return _measure(target, actor, QUICK_CALLS if quick else CALLS, quick)


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

[idempotency]
replay_key = "bench-only-replay-key-0123456789"
"""


def _measure(target: str, actor: str, calls: int, quick: bool) -> bool:
    rt = warden.Runtime(target, service="bench", token="bench-token")  # noqa: S106 (a test token)

    @rt.capability("bench.echo", input=Echo, output=Echo, side_effect="read")
    def echo(inp: Echo, ctx: warden.Context) -> Echo:
        return inp

    rt.register()
    with grpc.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        check = health_pb2.HealthCheckRequest(service="")
        for _ in range(50):
            health.Check(check)
        bare = _median_seconds(lambda: health.Check(check), calls)

    def call(i: int = 0) -> None:
        envelope = rt.invoke("bench.echo", {"n": i, "note": "x"}, actor=actor)
        assert envelope.status == "succeeded", envelope

    for _ in range(20):
        call()
    governed = _median_seconds(call, calls // 2)

    started = time.perf_counter()
    for i in range(calls):
        call(i)
    one_caller = calls / (time.perf_counter() - started)
    with ThreadPoolExecutor(THREADS) as pool:
        started = time.perf_counter()
        list(pool.map(call, range(calls)))
        many_callers = calls / (time.perf_counter() - started)
    rt.close()

    ratio = governed / bare
    speedup = many_callers / one_caller
    ok_sequential = ratio <= SEQUENTIAL_TARGET
    ok_concurrent = speedup >= CONCURRENT_TARGET
    print("pipeline: a governed call (Begin, handler, Complete, 2 durable audit records)")
    print(f"  bare gRPC round trip       {bare * 1e3:7.3f} ms (baseline)")
    print(
        f"  governed call              {governed * 1e3:7.3f} ms  ratio {ratio:5.1f}x "
        f"(target <= {SEQUENTIAL_TARGET:g}x)  {verdict(ok_sequential, quick)}"
    )
    print(f"  throughput, 1 caller       {one_caller:7.0f} calls/s (baseline)")
    print(
        f"  throughput, {THREADS} callers      {many_callers:7.0f} calls/s  ratio {speedup:5.2f}x "
        f"(target >= {CONCURRENT_TARGET:g}x)  {verdict(ok_concurrent, quick)}"
    )
    ok = ok_sequential and ok_concurrent
    figures = {
        "calls": calls,
        "bare_round_trip_ms": bare * 1e3,
        "governed_call_ms": governed * 1e3,
        "governed_ratio": ratio,
        "governed_ratio_target_at_most": SEQUENTIAL_TARGET,
        "throughput_1_caller_per_s": one_caller,
        f"throughput_{THREADS}_callers_per_s": many_callers,
        "concurrency_speedup": speedup,
        "concurrency_speedup_target_at_least": CONCURRENT_TARGET,
        "ok": ok,
    }
    write_results("pipeline", figures, ok=ok, quick=quick)
    return True if quick else ok


def _median_seconds(action: object, times: int) -> float:
    assert callable(action)
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


if __name__ == "__main__":
    raise SystemExit(0 if run(quick="--quick" in sys.argv[1:]) else 1)
