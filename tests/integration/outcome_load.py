"""A client process for the kill-under-load tests (a plane restarted, a
replica killed): many concurrent calls through the SDK until a stop file
appears, then the outbox drained and every call's answer written out as JSON
lines (invocation id, status, error code).

    python -m tests.integration.outcome_load TARGET OUTBOX ACTOR CALLERS STOP RESULTS

With the helpers those tests share to start planes and clients and to wait
for the log to grow.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import warden
from tests.conftest import ORDERS_TOKEN, ROOT
from tests.integration.lab import EchoIn, EchoOut

HANDLER_S = 0.02
"""How long a handler works: calls are mid-handler when the plane goes away."""
DRAIN_MS = 120_000


async def load(target: str, outbox: Path, actor: str, callers: int, stop: Path) -> list[str]:
    rt = warden.Runtime(
        target, service="orders", token=ORDERS_TOKEN, outbox=outbox, retry=warden.NO_RETRY
    )

    @rt.capability("orders.ship", input=EchoIn, output=EchoOut, side_effect="write")
    async def ship(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        await asyncio.sleep(HANDLER_S)
        return EchoOut(n=inp.n)

    answers: list[str] = []

    async def caller(number: int) -> None:
        n = 0
        while not stop.exists():
            envelope = await rt.ainvoke("orders.ship", {"n": number * 100_000 + n}, actor=actor)
            code = envelope.error.code if envelope.error else ""
            answers.append(json.dumps([envelope.invocation_id, envelope.status, code]))
            if envelope.status != "succeeded":
                await asyncio.sleep(0.05)  # the plane is away
            n += 1

    await asyncio.gather(*(caller(i) for i in range(callers)))
    left = await rt.aflush(timeout_ms=DRAIN_MS)
    await rt.aclose()
    rt.close()
    if left:
        raise SystemExit(f"{left} outcome reports were not taken")
    return answers


def start_client(
    target: str, outbox: Path, actor: str, callers: int, stop: Path, results: Path
) -> subprocess.Popen[bytes]:
    """This module as a client process (see the module docstring)."""
    command = [sys.executable, "-m", "tests.integration.outcome_load"]
    arguments = [target, str(outbox), actor, str(callers), str(stop), str(results)]
    return subprocess.Popen([*command, *arguments], cwd=ROOT)


def wait_for_count(
    count: Callable[[], int],
    at_least: int,
    clients: list[subprocess.Popen[bytes]],
    what: str,
    within_s: float = 90,
) -> None:
    """Wait until ``count()`` reaches ``at_least``, while every client still runs."""
    deadline = time.monotonic() + within_s
    while count() < at_least:
        assert all(c.poll() is None for c in clients), "a client process ended early"
        assert time.monotonic() < deadline, f"fewer than {at_least} {what} in {within_s:.0f} s"
        time.sleep(0.05)


def main() -> None:
    target, outbox, actor, callers, stop, results = sys.argv[1:]
    answers = asyncio.run(load(target, Path(outbox), actor, int(callers), Path(stop)))
    Path(results).write_text("".join(f"{a}\n" for a in answers))


if __name__ == "__main__":
    main()
