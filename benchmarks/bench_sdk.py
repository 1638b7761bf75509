"""The SDK's cost, end to end, against a plane running as ``warden serve`` in
its own process.

1. Overhead at one call in flight: ``Runtime.invoke`` of a trivial handler,
   minus the handler's own time, is what governance adds to a call (Begin and
   its durable decision record, validation, the outcome report written to the
   outbox; the outbox sends ``Complete`` in the background). Reported beside the
   baseline of a bare unary gRPC round trip (a health check), the two taken
   in turns over ``ROUNDS`` rounds so that both see the same spells of a
   shared machine. Target: p50 overhead, over every call of every round,
   under ``OVERHEAD_P50_TARGET_MS``.
2. Load: ``CONCURRENCY`` concurrent ``ainvoke`` calls on one asyncio event
   loop and one Runtime, sustained for ``DURATION_S``: throughput, p50, p99,
   errors. Targets: p99 under ``LOAD_P99_TARGET_S`` and no errors; afterwards
   ``warden audit verify --config FILE`` must find the hash chain intact.

Quick mode: one round of 30 sequential calls, then 20 concurrent callers for
2 s; no figure is judged, but the chain must still verify.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import BaseModel

import warden
from benchmarks import ECHO_POLICIES, percentile, plane, verdict, warden_command, write_results
from warden_server.auth.actors import mint_token
from warden_server.config import load_config

OVERHEAD_P50_TARGET_MS = 2.0
LOAD_P99_TARGET_S = 1.0
SEQUENTIAL_CALLS = 200
"""Sequential calls per round, and as many bare round trips."""
ROUNDS = 5
CONCURRENCY = 500
DURATION_S = 60.0
QUICK_SEQUENTIAL_CALLS = 30
QUICK_ROUNDS = 1
QUICK_CONCURRENCY = 20
QUICK_DURATION_S = 2.0

CONFIG = """
[server]
store = "warden.db"
policies = "policies"

[actors]
hs256_secret = "bench-only-secret-0123456789abcdef"

[services.bench]
token = "bench-token"
namespaces = ["bench"]

[idempotency]
replay_key = "bench-only-replay-key-0123456789"
"""
SERVICE_TOKEN = "bench-token"  # noqa: S105 (a benchmark's own token)


class Echo(BaseModel):
    n: int
    note: str = ""


@dataclass
class Load:
    """What the concurrent callers saw."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    retried: int = 0
    retry_causes: Counter[str] = field(default_factory=Counter)
    """Why the attempts that were retried failed, from the runtime's log."""
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    """The CPU this process (the runtime and its callers, not the plane) spent meanwhile."""

    @property
    def calls(self) -> int:
        return len(self.latencies)


def run(quick: bool = False) -> bool:
    with tempfile.TemporaryDirectory(prefix="warden-bench-") as folder:
        root = Path(folder)
        (root / "policies").mkdir()
        (root / "policies" / "bench.yaml").write_text(ECHO_POLICIES)
        config_file = root / "warden.toml"
        config_file.write_text(CONFIG)
        actor = mint_token(
            load_config(config_file, environ={}), subject="b", roles=["member"], ttl_seconds=7200
        )
        with plane(config_file) as target:
            rounds = _overhead(
                target,
                actor,
                QUICK_ROUNDS if quick else ROUNDS,
                QUICK_SEQUENTIAL_CALLS if quick else SEQUENTIAL_CALLS,
                root,
            )
            concurrency = QUICK_CONCURRENCY if quick else CONCURRENCY
            duration = QUICK_DURATION_S if quick else DURATION_S
            load = asyncio.run(_load(target, actor, concurrency, duration, root))
            verified = subprocess.run(
                [*warden_command(), "audit", "verify", "--config", str(config_file)],
                capture_output=True,
                text=True,
                check=False,
            )
    return _report(rounds, load, concurrency, duration, verified, quick)


@dataclass
class Round:
    """One round at one call in flight: bare round trips, then as many invokes."""

    bare: list[float] = field(default_factory=list)
    overhead: list[float] = field(default_factory=list)
    """Each invoke's latency minus its handler's own time."""
    handler: list[float] = field(default_factory=list)


def _overhead(target: str, actor: str, rounds: int, calls: int, folder: Path) -> list[Round]:
    """Bare round trips and invoke overhead at one in flight, taken in turns:
    a spell of a shared machine then slows both, not the invokes alone."""
    rt = _runtime(target, folder)
    handler_seconds = [0.0]

    @rt.capability("bench.echo", input=Echo, output=Echo, side_effect="read")
    def echo(inp: Echo, ctx: warden.Context) -> Echo:
        started = time.perf_counter()
        out = Echo(n=inp.n, note=inp.note)
        handler_seconds[0] = time.perf_counter() - started
        return out

    taken: list[Round] = []
    try:
        with grpc.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            check = health_pb2.HealthCheckRequest(service="")
            for _ in range(50):
                health.Check(check)
            rt.register()
            for i in range(20):
                _expect_success(rt.invoke("bench.echo", {"n": i, "note": "x"}, actor=actor))
            for _ in range(rounds):
                each = Round()
                for _ in range(calls):
                    started = time.perf_counter()
                    health.Check(check)
                    each.bare.append(time.perf_counter() - started)
                for i in range(calls):
                    handler_seconds[0] = 0.0
                    started = time.perf_counter()
                    envelope = rt.invoke("bench.echo", {"n": i, "note": "x"}, actor=actor)
                    latency = time.perf_counter() - started
                    _expect_success(envelope)
                    each.handler.append(handler_seconds[0])
                    each.overhead.append(latency - handler_seconds[0])
                taken.append(each)
    finally:
        rt.close()
    return taken


async def _load(target: str, actor: str, concurrency: int, duration: float, folder: Path) -> Load:
    """``concurrency`` callers, each invoking again as soon as its call returns."""
    rt = _runtime(target, folder)

    @rt.capability("bench.echo", input=Echo, output=Echo, side_effect="read")
    def echo(inp: Echo, ctx: warden.Context) -> Echo:
        return inp

    load = Load()
    retries = _RetryCauses(load.retry_causes)
    sdk_log = logging.getLogger("warden")
    level = sdk_log.level
    sdk_log.setLevel(logging.INFO)
    sdk_log.addHandler(retries)
    try:
        await rt.aregister()
        deadline = time.perf_counter() + duration

        async def caller() -> None:
            i = 0
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    envelope = await rt.ainvoke("bench.echo", {"n": i, "note": "x"}, actor=actor)
                except Exception as exc:
                    load.errors[f"raised {type(exc).__name__}"] += 1
                else:
                    if envelope.status != "succeeded":
                        code = envelope.error.code if envelope.error else "?"
                        load.errors[f"{envelope.status} {code}"] += 1
                    if envelope.attempt > 1:
                        load.retried += 1
                load.latencies.append(time.perf_counter() - started)
                i += 1

        started, cpu_started = time.perf_counter(), time.process_time()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        load.seconds = time.perf_counter() - started
        load.cpu_seconds = time.process_time() - cpu_started
    finally:
        sdk_log.removeHandler(retries)
        sdk_log.setLevel(level)
        await rt.aclose()
        rt.close()
    return load


class _RetryCauses(logging.Handler):
    """Counts the runtime's retries by the code and cause of the failed attempt."""

    def __init__(self, causes: Counter[str]) -> None:
        super().__init__(logging.INFO)
        self._causes = causes

    def emit(self, record: logging.LogRecord) -> None:
        code = getattr(record, "warden_code", None)
        if code is None:
            return
        cause = getattr(record, "warden_cause", None)
        said = f"{code} ({type(cause).__name__}: {str(cause)[:120]})" if cause else code
        self._causes[said] += 1


def _runtime(target: str, folder: Path) -> warden.Runtime:
    """A runtime whose outbox is in the benchmark's own folder."""
    return warden.Runtime(
        target, service="bench", token=SERVICE_TOKEN, outbox=folder / "outbox-bench.sqlite"
    )


def _expect_success(envelope: warden.Envelope) -> None:
    if envelope.status != "succeeded":
        raise RuntimeError(f"a benchmark call did not succeed: {envelope}")


def _report(
    rounds: list[Round],
    load: Load,
    concurrency: int,
    duration: float,
    verified: subprocess.CompletedProcess[str],
    quick: bool,
) -> bool:
    bare = [seconds for each in rounds for seconds in each.bare]
    overhead = [seconds for each in rounds for seconds in each.overhead]
    handler = [seconds for each in rounds for seconds in each.handler]
    bare_p50, bare_p99 = percentile(bare, 50), percentile(bare, 99)
    bare_by_round = [percentile(each.bare, 50) * 1e3 for each in rounds]
    over_by_round = [percentile(each.overhead, 50) * 1e3 for each in rounds]
    over_p50, over_p99 = percentile(overhead, 50), percentile(overhead, 99)
    over_mean = sum(overhead) / len(overhead)
    ok_overhead = over_p50 * 1e3 < OVERHEAD_P50_TARGET_MS
    load_p50, load_p99 = percentile(load.latencies, 50), percentile(load.latencies, 99)
    errors = sum(load.errors.values())
    ok_latency = load_p99 < LOAD_P99_TARGET_S
    ok_errors = errors == 0
    chain_intact = verified.returncode == 0 and "chain intact" in verified.stdout
    throughput = load.calls / load.seconds if load.seconds else 0.0

    print(
        f"sdk: Runtime.invoke of a trivial handler, 1 in flight "
        f"({len(rounds)} round(s) of {len(rounds[0].overhead)} bare round trips, "
        f"then as many calls)"
    )
    print(f"  bare gRPC round trip   p50 {bare_p50 * 1e3:7.3f} ms  p99 {bare_p99 * 1e3:7.3f} ms")
    print(
        f"  invoke overhead        p50 {over_p50 * 1e3:7.3f} ms  p99 {over_p99 * 1e3:7.3f} ms"
        f"  mean {over_mean * 1e3:.3f} ms"
        f"  ({over_p50 / bare_p50:.1f}x / {over_p99 / bare_p99:.1f}x the bare round trip; "
        f"handler p50 {percentile(handler, 50) * 1e6:.0f} us)"
    )
    if len(rounds) > 1:
        print(
            f"  p50 by round: bare {_spread(bare_by_round)} ms, "
            f"invoke overhead {_spread(over_by_round)} ms"
        )
    print(
        f"  p50 overhead < {OVERHEAD_P50_TARGET_MS:g} ms: "
        f"{over_p50 * 1e3:.3f} ms  {verdict(ok_overhead, quick)}"
    )
    print(f"sdk: {concurrency} concurrent ainvoke callers for {duration:g} s, one Runtime")
    print(
        f"  {load.calls:,} calls in {load.seconds:.1f} s: {throughput:,.0f} calls/s; "
        f"p50 {load_p50 * 1e3:.1f} ms, p99 {load_p99 * 1e3:.1f} ms "
        f"({load_p50 / bare_p50:,.0f}x / {load_p99 / bare_p99:,.0f}x the bare round trip); "
        f"{load.retried:,} needed a retry; the SDK's CPU "
        f"{load.cpu_seconds / max(load.calls, 1) * 1e3:.3f} ms per call"
    )
    for cause, count in load.retry_causes.most_common(3):
        print(f"    retried after {count:,} attempts failed with {cause}")
    print(
        f"  p99 < {LOAD_P99_TARGET_S * 1e3:g} ms: {load_p99 * 1e3:.1f} ms  "
        f"{verdict(ok_latency, quick)}"
    )
    detail = ", ".join(f"{n:,} {what}" for what, n in load.errors.most_common())
    print(
        f"  errors = 0: {errors:,}{f' ({detail})' if detail else ''}  {verdict(ok_errors, quick)}"
    )
    answer = (verified.stdout + verified.stderr).strip()
    # The verdict on the chain's line; what the command adds (what a chain
    # without an anchor cannot prove) indented below it.
    first, *rest = answer.splitlines() or [""]
    print(f"  warden audit verify: {first}  {'ok' if chain_intact else 'FAILED'}")
    for line in rest:
        print(f"    {line}")

    ok = ok_overhead and ok_latency and ok_errors and chain_intact
    figures = {
        "sequential_calls": len(overhead),
        "rounds": len(rounds),
        "bare_round_trip_p50_ms_by_round": bare_by_round,
        "invoke_overhead_p50_ms_by_round": over_by_round,
        "bare_round_trip_p50_ms": bare_p50 * 1e3,
        "bare_round_trip_p99_ms": bare_p99 * 1e3,
        "invoke_overhead_p50_ms": over_p50 * 1e3,
        "invoke_overhead_p99_ms": over_p99 * 1e3,
        "invoke_overhead_mean_ms": over_mean * 1e3,
        "invoke_overhead_p50_ratio_to_bare": over_p50 / bare_p50,
        "invoke_overhead_p50_target_ms_below": OVERHEAD_P50_TARGET_MS,
        "load_concurrency": concurrency,
        "load_duration_s": load.seconds,
        "load_calls": load.calls,
        "load_throughput_per_s": throughput,
        "load_p50_ms": load_p50 * 1e3,
        "load_sdk_cpu_per_call_ms": load.cpu_seconds / max(load.calls, 1) * 1e3,
        "load_p99_ms": load_p99 * 1e3,
        "load_p99_target_ms_below": LOAD_P99_TARGET_S * 1e3,
        "load_errors": errors,
        "load_errors_by_kind": dict(load.errors),
        "load_retried": load.retried,
        "load_retry_causes": dict(load.retry_causes),
        "audit_chain_intact": chain_intact,
        "audit_verify_output": answer,
        "ok": ok,
    }
    write_results("sdk", figures, ok=ok, quick=quick)
    # Even a quick run must leave an intact chain: that is correctness, not speed.
    return chain_intact if quick else ok


def _spread(figures: list[float]) -> str:
    return f"{min(figures):.3f}-{max(figures):.3f}"


if __name__ == "__main__":
    raise SystemExit(0 if run(quick="--quick" in sys.argv[1:]) else 1)
