"""Policy decisions scale with the rules that match a capability, not with
the size of the policy set: 2,000 rules across 1,000 namespaces must decide
at least half as fast as 10 rules, with the same two rules matching.

Quick mode decides 100 times over 10 and 200 rules and judges no figure."""

from __future__ import annotations

import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import verdict, write_results
from warden_server.policy.engine import PolicySet
from warden_server.policy.loader import load_policies
from warden_server.policy.variables import decision_variables

TARGET_RATIO = 0.5
DECISIONS = 2000
NAMESPACES = 1000
QUICK_DECISIONS = 100
QUICK_NAMESPACES = 100


def policy_set(namespaces: int) -> PolicySet:
    """Two rules per namespace (an allow and a deny over input), like a real set."""
    lines = ["rules:"]
    for n in range(namespaces):
        lines += [
            f"  - id: ns{n}-members",
            f'    capabilities: ["ns{n}.*"]',
            "    effect: allow",
            '    when: actor.tenant != "" && "member" in actor.roles',
            f"  - id: ns{n}-limit",
            f'    capabilities: ["ns{n}.write"]',
            "    effect: deny",
            "    when: input.n > 100",
        ]
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "rules.yaml").write_text("\n".join(lines) + "\n")
        return load_policies(folder)


def decisions_per_second(policies: PolicySet, decisions: int = DECISIONS) -> float:
    """Steps 4 and 7 for one capability, as Begin runs them, best of three."""
    now = datetime.now(UTC)
    capability = {"id": "ns3.write", "version": "1", "service": "s", "side_effect": "write"}
    best = 0.0
    for _ in range(3):
        started = time.perf_counter()
        for i in range(decisions):
            base = policies.activation(
                decision_variables(
                    actor={"id": "a", "roles": ["member"], "tenant": "t", "attrs": {}},
                    capability=capability,
                    context={},
                    surface="direct",
                    now=now,
                )
            )
            assert policies.visibility("ns3.write", base).effect == "allow"
            activation = policies.activation({"input": {"n": i % 200}}, base)
            policies.decide("ns3.write", activation)
        best = max(best, decisions / (time.perf_counter() - started))
    return best


def run(quick: bool = False) -> bool:
    decisions = QUICK_DECISIONS if quick else DECISIONS
    namespaces = QUICK_NAMESPACES if quick else NAMESPACES
    small = decisions_per_second(policy_set(5), decisions)
    large = decisions_per_second(policy_set(namespaces), decisions)
    ratio = large / small
    ok = ratio >= TARGET_RATIO
    print(
        f"policy decisions: 10 rules {small:,.0f}/s, {2 * namespaces:,} rules {large:,.0f}/s; "
        f"ratio {ratio:.2f} (target >= {TARGET_RATIO}) {verdict(ok, quick)}"
    )
    figures = {
        "decisions": decisions,
        "small_rules": 10,
        "small_decisions_per_s": small,
        "large_rules": 2 * namespaces,
        "large_decisions_per_s": large,
        "ratio": ratio,
        "ratio_target_at_least": TARGET_RATIO,
        "ok": ok,
    }
    write_results("policy", figures, ok=ok, quick=quick)
    return True if quick else ok


if __name__ == "__main__":
    raise SystemExit(0 if run(quick="--quick" in sys.argv[1:]) else 1)
