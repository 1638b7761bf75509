"""A plane at scale: 1,000 registered capabilities and 5,000 policy rules,
served by ``warden serve`` in its own process.

The capabilities belong to 50 namespaces of one service, which registers them
through the SDK. The rules are what policy authors write: one file per
namespace, each with an allow and a guard over the whole namespace and about
five rules per capability (exact ids and globs; deny, require_approval, hide
and audit-mode rules) whose CEL conditions read input fields and actor roles.

Targets, measured in one run:

- resident memory (``VmRSS``) of each process of the plane after loading the
  set and serving it: under ``RSS_TARGET_MB`` per process;
- Begin at 5,000 rules against Begin at 10 rules over the same capabilities
  (the baseline): p50 latency at one in flight and throughput at
  ``IN_FLIGHT`` in flight, each within ``BEGIN_TARGET_RATIO``;
- a hot reload after editing one policy file (write to the new revision in
  force, which includes the watcher's debounce) and a restart (process start
  to health SERVING): under ``RELOAD_TARGET_S`` and ``RESTART_TARGET_S``.

Quick mode: 20 capabilities and 100 rules; no figure is judged.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
from pydantic import BaseModel

import warden
from benchmarks import (
    free_port,
    percentile,
    process_tree,
    resident_bytes,
    start_plane,
    stop_plane,
    verdict,
    wait_until_serving,
    write_results,
)
from warden.shared.wire import SERVICE_TOKEN_METADATA
from warden.v1 import governor_pb2, governor_pb2_grpc, policy_pb2, policy_pb2_grpc
from warden_server.auth.actors import mint_token
from warden_server.config import load_config

RSS_TARGET_MB = 300
BEGIN_TARGET_RATIO = 1.5
RELOAD_TARGET_S = 3.0
RESTART_TARGET_S = 3.0
IN_FLIGHT = 16


@dataclass(frozen=True, slots=True)
class Size:
    namespaces: int
    operations: int
    """Capabilities per namespace."""
    rules: int
    sequential: int
    """Begins timed one at a time, per policy set."""
    concurrent: int
    """Begins timed ``IN_FLIGHT`` at a time, per policy set."""

    @property
    def capabilities(self) -> int:
        return self.namespaces * self.operations


FULL = Size(namespaces=50, operations=20, rules=5_000, sequential=300, concurrent=800)
QUICK = Size(namespaces=2, operations=10, rules=100, sequential=20, concurrent=40)

SERVICE_TOKEN = "scale-token"  # noqa: S105 (a benchmark's own token)
INPUT = '{"amount":120,"region":"eu","priority":1,"note":"x"}'
DEBOUNCE_MS = 300  # the plane's default [server] policy_debounce_ms, stated here to be seen


class Order(BaseModel):
    amount: int
    region: str
    priority: int = 0
    note: str = ""


class Receipt(BaseModel):
    ok: bool


def run(quick: bool = False) -> bool:
    size = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="warden-bench-") as folder:
        root = Path(folder)
        policies = root / "policies"
        policies.mkdir()
        (policies / "base.yaml").write_text(small_policy_set())
        config_file = root / "warden.toml"
        config_file.write_text(_config(size))
        config = load_config(config_file, environ={})
        actor = mint_token(config, subject="bot", roles=["member"], tenant="acme")
        author = mint_token(config, subject="pat", roles=["policy-author"])
        figures = _measure(size, root, config_file, actor, author)
    return _report(size, figures, quick)


def _measure(
    size: Size, root: Path, config_file: Path, actor: str, author: str
) -> dict[str, float]:
    figures: dict[str, float] = {}
    policies = root / "policies"
    port = free_port()
    target = f"127.0.0.1:{port}"
    process = start_plane(config_file, port)
    try:
        wait_until_serving(target, process)
        started = time.perf_counter()
        ids = _register(target, size)
        figures["register_s"] = time.perf_counter() - started
        with grpc.insecure_channel(target) as channel:
            status = _Status(channel, author)
            small = _begins(channel, actor, ids, size)
            figures |= {f"small_{k}": v for k, v in small.items()}

            # Load the large set into the running plane: one file per namespace,
            # then the small set goes. The watcher may load it in several steps.
            started = time.perf_counter()
            for namespace in range(size.namespaces):
                path = policies / f"ns{namespace:02d}.yaml"
                path.write_text(namespace_policies(namespace, size))
            (policies / "base.yaml").unlink()
            status.wait(lambda s: s.rules == size.rules and not s.HasField("rejected"))
            figures["load_large_set_s"] = time.perf_counter() - started

            large = _begins(channel, actor, ids, size)
            figures |= {f"large_{k}": v for k, v in large.items()}

            # A policy author edits one rule of one file.
            before = status.get().current.revision
            edited = policies / "ns00.yaml"
            text = edited.read_text()
            if "> 100002" not in text:
                raise RuntimeError("the rule to edit is not in ns00.yaml")
            started = time.perf_counter()
            edited.write_text(text.replace("> 100002", "> 100003"))
            answer = status.wait(lambda s: s.current.revision != before or s.HasField("rejected"))
            figures["reload_s"] = time.perf_counter() - started
            if answer.HasField("rejected"):
                raise RuntimeError(f"the edited policy set was refused: {answer.problems}")
        figures["rss_mb_after_load"] = _largest_rss_mb(process.pid)
        figures["processes_after_load"] = len(process_tree(process.pid))
        stop_plane(process)

        port = free_port()
        target = f"127.0.0.1:{port}"
        started = time.perf_counter()
        process = start_plane(config_file, port)
        wait_until_serving(target, process)
        figures["restart_s"] = time.perf_counter() - started
        with grpc.insecure_channel(target) as channel:
            _begins(channel, actor, ids, size, warm_only=True)
        figures["rss_mb_after_restart"] = _largest_rss_mb(process.pid)
        figures["processes_after_restart"] = len(process_tree(process.pid))
    finally:
        stop_plane(process)
    return figures


# -- the capabilities and the policy sets ----------------------------------------


def capability_ids(size: Size) -> list[str]:
    return [f"ns{n:02d}.op{k:02d}" for n in range(size.namespaces) for k in range(size.operations)]


def small_policy_set() -> str:
    """Ten rules over every namespace: the baseline."""
    return """rules:
  - id: members-may-call
    capabilities: ["ns*.*"]
    effect: allow
    when: '"member" in actor.roles'
  - id: support-may-read
    capabilities: ["ns*.op0?"]
    effect: allow
    when: '"support" in actor.roles'
  - id: notes-stay-short
    capabilities: ["ns*.*"]
    effect: deny
    when: size(input.note) > 500
    message: "Keep the note under 500 characters."
  - id: big-amounts
    capabilities: ["ns*.op0*"]
    effect: deny
    when: input.amount > 100000
    message: "Amounts above 100,000 are not allowed."
  - id: large-amounts-need-a-manager
    capabilities: ["ns*.op1*"]
    effect: require_approval
    when: input.amount > 50000 && !("manager" in actor.roles)
    message: "Amounts above 50,000 need a manager."
    approvers: '"manager" in approver.roles'
    ttl: 1h
  - id: no-exports-to-cn
    capabilities: ["ns*.*"]
    effect: deny
    when: input.region == "cn" && !("exporter" in actor.roles)
    message: "This region needs an exporter."
  - id: contractors-see-less
    capabilities: ["ns*.*"]
    effect: hide
    when: '"contractor" in actor.roles'
  - id: high-priority-trial
    capabilities: ["ns*.*"]
    effect: deny
    mode: audit
    when: input.priority > 8
    message: "High priority is reserved."
  - id: blocked-tenant
    capabilities: ["ns0*.*"]
    effect: deny
    when: actor.tenant == "blocked"
    message: "This tenant is blocked."
  - id: no-negative-amounts
    capabilities: ["ns*.op19"]
    effect: deny
    when: input.amount < 0
    message: "Amounts cannot be negative."
"""


def namespace_policies(namespace: int, size: Size) -> str:
    """One namespace's file: ``size.rules / size.namespaces`` rules, two over
    the namespace and the rest about five per capability."""
    ns = f"ns{namespace:02d}"
    count = size.rules // size.namespaces
    lines = [
        "rules:",
        f"  - id: {ns}-members",
        f'    capabilities: ["{ns}.*"]',
        "    effect: allow",
        "    when: '\"member\" in actor.roles'",
        f"  - id: {ns}-short-notes",
        f'    capabilities: ["{ns}.*"]',
        "    effect: deny",
        "    when: size(input.note) > 500",
        '    message: "Keep the note under 500 characters."',
    ]
    for i in range(2, count):
        op = f"{ns}.op{i % size.operations:02d}"
        kind = (i // size.operations) % 5
        lines += [f"  - id: {ns}-r{i:03d}"]
        if kind == 0:
            lines += [
                f'    capabilities: ["{op}"]',
                "    effect: deny",
                f"    when: input.amount > {100_000 + i}",
                '    message: "This amount is too large."',
            ]
        elif kind == 1:
            lines += [
                f'    capabilities: ["{op}"]',
                "    effect: require_approval",
                f'    when: input.amount > {50_000 + i} && !("manager" in actor.roles)',
                '    message: "This amount needs a manager."',
                "    approvers: '\"manager\" in approver.roles'",
                "    ttl: 1h",
            ]
        elif kind == 2:
            lines += [
                f'    capabilities: ["{op}*"]',
                "    effect: deny",
                f'    when: input.region == "r{i}" && !("exporter" in actor.roles)',
                '    message: "This region needs an exporter."',
            ]
        elif kind == 3:
            lines += [
                f'    capabilities: ["{op}"]',
                "    effect: hide",
                f'    when: \'"contractor" in actor.roles && actor.tenant == "t{i}"\'',
            ]
        else:
            lines += [
                f'    capabilities: ["{op}"]',
                "    effect: deny",
                "    mode: audit",
                f"    when: input.priority > {5 + i % 5}",
                '    message: "High priority is reserved."',
            ]
    return "\n".join(lines) + "\n"


def _config(size: Size) -> str:
    namespaces = ", ".join(f'"ns{n:02d}"' for n in range(size.namespaces))
    return f"""
[server]
store = "warden.db"
policies = "policies"
policy_debounce_ms = {DEBOUNCE_MS}

[actors]
hs256_secret = "bench-only-secret-0123456789abcdef"

[services.scale]
token = "{SERVICE_TOKEN}"
namespaces = [{namespaces}]

[limits]
max_capabilities_per_service = {max(500, size.capabilities)}

[idempotency]
replay_key = "bench-only-replay-key-0123456789"
"""


def _register(target: str, size: Size) -> list[str]:
    """Register every capability through the SDK, as one service would."""
    ids = capability_ids(size)

    def handle(inp: Order, ctx: warden.Context) -> Receipt:
        return Receipt(ok=True)

    with warden.Runtime(target, service="scale", token=SERVICE_TOKEN) as rt:
        for capability in ids:
            rt.capability(capability, input=Order, output=Receipt, side_effect="read")(handle)
        registered = rt.register()
    if len(registered) != len(ids):
        raise RuntimeError(f"registered {len(registered)} of {len(ids)} capabilities")
    return ids


# -- measuring ---------------------------------------------------------------------


class _Status:
    """The policy set in force, through the Policies RPC."""

    def __init__(self, channel: grpc.Channel, author: str) -> None:
        self._stub = policy_pb2_grpc.PoliciesStub(channel)
        self._request = policy_pb2.PolicyStatusRequest(actor_token=author)

    def get(self) -> policy_pb2.PolicyStatus:
        status: policy_pb2.PolicyStatus = self._stub.GetStatus(self._request, timeout=10)
        return status

    def wait(self, done: object, seconds: float = 300) -> policy_pb2.PolicyStatus:
        assert callable(done)
        deadline = time.monotonic() + seconds
        while True:
            status = self.get()
            if done(status):
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"the policy set did not change in {seconds:g}s: {status}")
            time.sleep(0.01)


def _begins(
    channel: grpc.Channel, actor: str, ids: list[str], size: Size, *, warm_only: bool = False
) -> dict[str, float]:
    """Begin over every capability in turn: latency one at a time, then throughput."""
    governor = governor_pb2_grpc.GovernorStub(channel)
    metadata = ((SERVICE_TOKEN_METADATA, SERVICE_TOKEN),)

    def begin(i: int) -> float:
        request = governor_pb2.BeginRequest(
            invocation_id=str(uuid.uuid4()),
            capability_id=ids[i % len(ids)],
            actor_token=actor,
            input_json=INPUT,
            surface="direct",
            context_json="{}",
            call_id=str(uuid.uuid4()),
            attempt=1,
        )
        started = time.perf_counter()
        response = governor.Begin(request, metadata=metadata, timeout=60)
        seconds = time.perf_counter() - started
        if response.WhichOneof("outcome") != "grant":
            raise RuntimeError(f"Begin of {request.capability_id} was not granted: {response}")
        return seconds

    # Every capability once first: a version's input validator is built on its
    # first call (about 1 ms), and neither set's figures should include that.
    for i in range(max(20, len(ids))):
        begin(i)
    if warm_only:
        return {}
    latencies = [begin(i) for i in range(size.sequential)]
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        started = time.perf_counter()
        list(pool.map(begin, range(size.concurrent)))
        throughput = size.concurrent / (time.perf_counter() - started)
    return {
        "begin_p50_ms": statistics.median(latencies) * 1e3,
        "begin_p99_ms": percentile(latencies, 99) * 1e3,
        "begin_per_s": throughput,
    }


def _largest_rss_mb(pid: int) -> float:
    """The resident memory of the plane's largest process (it and any children)."""
    sizes = []
    for member in process_tree(pid):
        try:
            sizes.append(resident_bytes(member))
        except OSError:
            continue  # a child that just ended
    return max(sizes) / 2**20


def _report(size: Size, figures: dict[str, float], quick: bool) -> bool:
    latency_ratio = figures["large_begin_p50_ms"] / figures["small_begin_p50_ms"]
    throughput_ratio = figures["small_begin_per_s"] / figures["large_begin_per_s"]
    rss = max(figures["rss_mb_after_load"], figures["rss_mb_after_restart"])
    checks = {
        "rss": rss < RSS_TARGET_MB,
        "begin_latency": latency_ratio <= BEGIN_TARGET_RATIO,
        "begin_throughput": throughput_ratio <= BEGIN_TARGET_RATIO,
        "reload": figures["reload_s"] < RELOAD_TARGET_S,
        "restart": figures["restart_s"] < RESTART_TARGET_S,
    }
    small, large = "10 rules", f"{size.rules:,} rules"
    print(
        f"scale: {size.capabilities:,} capabilities registered in {figures['register_s']:.2f} s; "
        f"{size.rules:,} rules in {size.namespaces} files"
    )
    print(
        f"  resident memory, largest plane process: {figures['rss_mb_after_load']:.0f} MB "
        f"after load ({figures['processes_after_load']:.0f} processes), "
        f"{figures['rss_mb_after_restart']:.0f} MB after restart; "
        f"target < {RSS_TARGET_MB} MB  {verdict(checks['rss'], quick)}"
    )
    print(
        f"  Begin p50, 1 in flight:   {small} {figures['small_begin_p50_ms']:7.2f} ms (baseline), "
        f"{large} {figures['large_begin_p50_ms']:7.2f} ms; ratio {latency_ratio:.2f}x "
        f"(target <= {BEGIN_TARGET_RATIO:g}x)  {verdict(checks['begin_latency'], quick)}"
    )
    print(
        f"  Begin p99, 1 in flight:   {small} {figures['small_begin_p99_ms']:7.2f} ms, "
        f"{large} {figures['large_begin_p99_ms']:7.2f} ms"
    )
    print(
        f"  Begin, {IN_FLIGHT} in flight:     {small} {figures['small_begin_per_s']:7.0f}/s "
        f"(baseline), {large} {figures['large_begin_per_s']:7.0f}/s; slower by "
        f"{throughput_ratio:.2f}x (target <= {BEGIN_TARGET_RATIO:g}x)  "
        f"{verdict(checks['begin_throughput'], quick)}"
    )
    print(
        f"  hot reload of one edited file: {figures['reload_s']:.2f} s "
        f"(from the write, the watcher's wait for quiet included); target < {RELOAD_TARGET_S:g} s  "
        f"{verdict(checks['reload'], quick)}"
    )
    print(
        f"  restart to SERVING: {figures['restart_s']:.2f} s; target < {RESTART_TARGET_S:g} s  "
        f"{verdict(checks['restart'], quick)}"
    )
    print(
        f"  (loading the large set into the running plane took {figures['load_large_set_s']:.2f} s)"
    )
    ok = all(checks.values())
    document = {
        "capabilities": size.capabilities,
        "rules": size.rules,
        "figures": figures,
        "begin_latency_ratio": latency_ratio,
        "begin_throughput_ratio": throughput_ratio,
        "targets": {
            "rss_mb_below": RSS_TARGET_MB,
            "begin_ratio_at_most": BEGIN_TARGET_RATIO,
            "reload_s_below": RELOAD_TARGET_S,
            "restart_s_below": RESTART_TARGET_S,
        },
        "checks": checks,
        "ok": ok,
    }
    write_results("scale", document, ok=ok, quick=quick)
    return True if quick else ok


if __name__ == "__main__":
    raise SystemExit(0 if run(quick="--quick" in sys.argv[1:]) else 1)
