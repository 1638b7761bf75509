"""No limit ever over-admits (hypothesis).

A limit of any kind and size, and a crowd of concurrent callers spread over
two planes on one store file (as the processes of a plane are), each asking
for its cost at moments that may run backwards between callers: what is
admitted never exceeds the limit, every refusal says when to retry, a
refused budget call would not have fit even after everyone else was served,
and callers at one moment get exactly as many calls as the limit allows.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warden_server.limits import admit
from warden_server.policy.engine import CompiledLimit, LimitCall
from warden_server.policy.loader import PolicySource, compile_policies
from warden_server.store import SQLiteStore

NOW = 1_800_000_000.0


def limit_of(kind: str, size: int) -> CompiledLimit:
    spec = {
        "rate": f"rate: 1/hour, burst: {size}",
        "budget": f"budget: {size}/day, cost: input.cost",
        "concurrency": f"concurrency: {size}",
    }[kind]
    text = f"limits:\n- {{id: lim, capabilities: [a.b], key: actor.tenant, {spec}}}"
    source = PolicySource(Path("policies"), (("limits.yaml", text.encode()),), "test")
    (limit,) = compile_policies(source).limits
    return limit


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    kind=st.sampled_from(["rate", "budget", "concurrency"]),
    size=st.integers(min_value=1, max_value=8),
    calls=st.lists(
        st.tuples(st.integers(min_value=0, max_value=5), st.floats(min_value=0, max_value=0.5)),
        min_size=1,
        max_size=16,
    ),
)
def test_no_limit_admits_more_than_it_allows(
    kind: str, size: int, calls: list[tuple[int, float]]
) -> None:
    limit = limit_of(kind, size)
    with tempfile.TemporaryDirectory() as folder:
        planes = [SQLiteStore(Path(folder) / "warden.db") for _ in range(2)]
        admitted: list[float] = []
        refused: list[tuple[float, int, bool]] = []
        lock = threading.Lock()
        barrier = threading.Barrier(len(calls))

        def call(n: int, cost: int, skew: float) -> None:
            amount = float(cost) if kind == "budget" else 1.0
            barrier.wait()
            admission = planes[n % 2].transact(
                lambda tx: admit(
                    tx,
                    [LimitCall(limit, "acme", amount)],
                    invocation_id=f"inv-{n}",
                    now=NOW + skew,
                    grant_expires=NOW + 3600,
                )
            )
            with lock:
                if admission.refusal is None:
                    admitted.append(amount)
                else:
                    r = admission.refusal
                    refused.append((amount, r.retry_after_ms, r.never))

        threads = [
            threading.Thread(target=call, args=(n, cost, skew))
            for n, (cost, skew) in enumerate(calls)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for plane in planes:
            plane.close()
    assert sum(admitted) <= size
    if kind == "concurrency" or (kind == "rate" and len({skew for _, skew in calls}) == 1):
        # Nor fewer: within half a second of an hourly rate no token comes back.
        # (A caller whose clock runs behind one already served may wait the
        # difference: under-admission by the skew, never over-admission.)
        assert len(admitted) == min(len(calls), size)
    for amount, retry_after_ms, never in refused:
        if never:
            assert amount > size
        else:
            assert retry_after_ms > 0
            if kind != "rate":  # a rate may also refuse by the skew (see above)
                assert sum(admitted) + amount > size
