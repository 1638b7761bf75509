"""Medians over rounds, the table, the ratios, the verdict and the JSON file.

Targets (judged at ``JUDGED_AT`` requests in flight):

- Warden's Begin serves at least as many calls per second as Cerbos's
  CheckResources, with a p99 latency no worse;
- Warden serves at least ``ECHO_SHARE`` of what a bare Python gRPC echo
  serves with the same processes: the governance costs little beyond gRPC.

A miss is printed and fails the run; it is never left out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

JUDGED_AT = 32
CERBOS_SHARE = 1.0
ECHO_SHARE = 0.8
METRICS = (
    "rps",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "max_ms",
    "server_cpu_cores",
    "cpu_cores",
    "other_cpu_cores",
)
TARGETS = ("warden", "cerbos", "echo")


@dataclass(frozen=True)
class Goal:
    name: str
    shown: str
    ok: bool


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each metric's median over the rounds of one point; errors are summed."""
    point: dict[str, Any] = {m: statistics.median(r[m] for r in rounds) for m in METRICS}
    point["errors"] = sum(r["errors_total"] for r in rounds)
    point["requests"] = sum(r["requests"] for r in rounds)
    point["first_error"] = next((r["first_error"] for r in rounds if r["first_error"]), None)
    # What one request costs the server: the figure the throughput follows
    # once the server has all the cores it can get.
    point["server_cpu_ms_per_request"] = _ratio(1000 * point["server_cpu_cores"], point["rps"])
    return point


def print_table(points: dict[tuple[str, int], dict[str, Any]], inflights: list[int]) -> None:
    print(
        f"  {'target':<8} {'in flight':>9} {'rps':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'server CPU':>10} {'CPU/req ms':>10} {'gen CPU':>8} {'other CPU':>9} {'errors':>7}"
    )
    for name in TARGETS:
        for k in inflights:
            p = points[name, k]
            print(
                f"  {name:<8} {k:>9} {p['rps']:>9.0f} {p['p50_ms']:>8.2f} {p['p99_ms']:>8.2f} "
                f"{p['server_cpu_cores']:>10.2f} {p['server_cpu_ms_per_request']:>10.3f} "
                f"{p['cpu_cores']:>8.2f} "
                f"{p['other_cpu_cores']:>9.2f} {p['errors']:>7}"
            )
    for name in TARGETS:
        for k in inflights:
            if points[name, k]["first_error"]:
                print(f"  {name} at {k} in flight, first error: {points[name, k]['first_error']}")
    print(
        "  (CPU in cores: CPU seconds over the measured window / its wall seconds; "
        "CPU/req: the server's CPU time per request; other = the rest of the machine)"
    )


def ratios(points: dict[tuple[str, int], dict[str, Any]], inflights: list[int]) -> dict[int, Any]:
    """Warden against each peer at each in-flight level."""
    found = {}
    for k in inflights:
        w, c, e = points["warden", k], points["cerbos", k], points["echo", k]
        found[k] = {
            "warden_vs_cerbos_rps": _ratio(w["rps"], c["rps"]),
            "warden_vs_echo_rps": _ratio(w["rps"], e["rps"]),
            "warden_vs_cerbos_p99": _ratio(w["p99_ms"], c["p99_ms"]),
        }
    return found


def print_ratios(found: dict[int, Any]) -> None:
    heads = ("in flight", "warden/cerbos rps", "warden/echo rps", "p99 warden/cerbos")
    print(f"  {heads[0]:>9} {heads[1]:>18} {heads[2]:>16} {heads[3]:>18}")
    for k, r in found.items():
        print(
            f"  {k:>9} {r['warden_vs_cerbos_rps']:>17.2f}x {r['warden_vs_echo_rps']:>15.2f}x "
            f"{r['warden_vs_cerbos_p99']:>17.2f}x"
        )


def judge(points: dict[tuple[str, int], dict[str, Any]]) -> list[Goal]:
    w, c, e = (points[name, JUDGED_AT] for name in TARGETS)
    vs_cerbos = _ratio(w["rps"], c["rps"])
    vs_echo = _ratio(w["rps"], e["rps"])
    return [
        Goal(
            f"warden rps >= {CERBOS_SHARE:g}x cerbos",
            f"{vs_cerbos:.2f}x ({w['rps']:.0f} vs {c['rps']:.0f})",
            vs_cerbos >= CERBOS_SHARE,
        ),
        Goal(
            "warden p99 <= cerbos p99",
            f"{w['p99_ms']:.2f} vs {c['p99_ms']:.2f} ms",
            w["p99_ms"] <= c["p99_ms"],
        ),
        Goal(
            f"warden rps >= {ECHO_SHARE:g}x echo",
            f"{vs_echo:.2f}x ({w['rps']:.0f} vs {e['rps']:.0f})",
            vs_echo >= ECHO_SHARE,
        ),
    ]


def print_goals(goals: list[Goal]) -> None:
    print(f"  targets at {JUDGED_AT} in flight:")
    for goal in goals:
        print(f"    {goal.name:<28} {goal.shown:<30} {'ok' if goal.ok else 'MISSED'}")


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0
