"""Warden against its peers under the same closed-loop load.

Three servers answer the same kind of call, driven by one C load generator
(``benchmarks/loadgen``) at 8, 32 and 64 requests in flight:

- ``warden``: ``Governor/Begin`` on a realistic request (JWT actor, 10-field
  input schema, 5 of 50 rules apply, a grant and its durable audit record);
- ``cerbos``: ``CheckResources`` on the same decision (``cerbos.py``);
- ``echo``: a bare ``grpc.aio`` echo, the floor Python gRPC sets.

Points are interleaved (round robin over targets, for several rounds) and each
figure is the median over rounds, so a slow moment on a shared machine hurts
every target alike. Everything the run needs beyond ``.venv`` is installed
into ``var/bench/peers`` (``install.py``); results go to ``var/bench/peers.json``
(``peers.quick.json`` for a smoke run), as every benchmark's do.

``python -m benchmarks peers`` or ``python -m benchmarks.peers [--quick]``.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks import write_results
from benchmarks.peers import install, loadgen, report, targets
from benchmarks.peers.cerbos import cerbos_pdp

INFLIGHTS = [8, 32, 64]
ROUNDS = 3
DURATION = 5.0
WARMUP = 1.0


def run(
    quick: bool = False,
    *,
    processes: int | None = None,
    rounds: int | None = None,
    duration: float | None = None,
) -> bool:
    """Measure, print the table and write the JSON; True when every target is met.

    Args:
        quick: a smoke run (8 in flight, one short round); it judges no target
            and is True when every server answered every call correctly.
        processes: server processes for Warden and the echo (default: CPUs).
        rounds: rounds of the interleaved points (default 3; 1 when quick).
        duration: seconds measured per point (default 5; 0.5 when quick).
    """
    inflights = [8] if quick else INFLIGHTS
    rounds = rounds or (1 if quick else ROUNDS)
    duration = duration or (0.5 if quick else DURATION)
    warmup = 0.2 if quick else WARMUP
    wanted = processes or os.cpu_count() or 1
    print("peers: Warden Begin vs Cerbos CheckResources vs a bare grpc.aio echo")
    try:
        generator = install.loadgen()
        cerbos_binary = install.cerbos()
    except install.InstallError as error:
        print(f"peers: cannot run: {error}")
        return False
    served = wanted
    print(
        f"  warden serve --processes {served}; the echo runs {served} processes too; "
        "cerbos is one Go process using every core"
    )
    print(
        f"  {os.cpu_count()} CPUs, {rounds} round(s) of {duration:g} s per point "
        f"after {warmup:g} s warmup, in flight {', '.join(map(str, inflights))}"
    )

    samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-peers-") as folder, ExitStack() as stack:
            root = Path(folder)
            token = targets.actor_token()
            warden = stack.enter_context(targets.warden_plane(root, served, token))
            servers = [
                warden,
                stack.enter_context(cerbos_pdp(cerbos_binary, root, token)),
                stack.enter_context(targets.echo_floor(root, served, warden.template)),
            ]
            for turn in range(rounds):
                for k in inflights:
                    # Rotate who goes first, so no target always follows the same one.
                    for server in servers[turn % 3 :] + servers[: turn % 3]:
                        sample = loadgen.measure(
                            generator, server, inflight=k, duration=duration, warmup=warmup
                        )
                        samples.setdefault((server.name, k), []).append(sample)
                        _progress(turn, server.name, k, sample)
    except (targets.TargetError, loadgen.LoadError) as error:
        print(f"peers: {error}")
        return False

    points = {key: report.medians(rounds_) for key, rounds_ in samples.items()}
    print(f"  median of {rounds} round(s):")
    report.print_table(points, inflights)
    busiest = max(p["other_cpu_cores"] for p in points.values())
    if busiest > 0.25 * (os.cpu_count() or 1):
        print(
            f"  note: other processes took up to {busiest:.2f} cores during the windows; "
            "the servers had that much less, so figures are noisier"
        )
    found = report.ratios(points, inflights)
    report.print_ratios(found)
    clean = all(p["errors"] == 0 and p["requests"] > 0 for p in points.values())
    goals = [] if quick else report.judge(points)
    if goals:
        report.print_goals(goals)
    if not clean:
        print("  some calls failed (see errors above): the figures are not valid")
    ok = clean and all(goal.ok for goal in goals)
    write_results(
        "peers",
        {
            "server_processes": served,
            "rounds": rounds,
            "duration_s": duration,
            "warmup_s": warmup,
            "points": [
                {"target": name, "inflight": k, "median": points[name, k], "rounds": s}
                for (name, k), s in samples.items()
            ],
            "ratios": {str(k): r for k, r in found.items()},
            "goals": [goal.__dict__ for goal in goals],
        },
        ok=ok,
        quick=quick,
    )
    print(f"  {'ok' if ok else 'MISSED'}")
    return ok


def _progress(turn: int, name: str, inflight: int, sample: dict[str, Any]) -> None:
    errors = f", {sample['errors_total']} errors" if sample["errors_total"] else ""
    spread = sample["connections_by_process"]
    cores = "/".join(f"{each:.2f}" for each in sample["cpu_cores_by_process"])
    # Only a split over several processes says anything: one process holds all.
    split = f", connections {'/'.join(map(str, spread))} (cores {cores})" if len(spread) > 1 else ""
    print(
        f"    round {turn + 1} {name:<7} {inflight:>3} in flight: {sample['rps']:8.0f} rps, "
        f"p99 {sample['p99_ms']:7.2f} ms{split}{errors}",
        flush=True,
    )
