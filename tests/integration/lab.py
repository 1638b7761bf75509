"""A laboratory service whose capabilities reach every outcome of the pipeline."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

import warden

LAB_POLICIES = """
rules:
  - id: lab-allow
    capabilities: ["orders.*"]
    effect: allow
    when: '!("nobody" in actor.roles)'
  - id: lab-deny-big
    capabilities: ["orders.echo"]
    effect: deny
    when: input.n > 100
    message: "Use a number of at most 100."
  - id: lab-broken
    capabilities: ["orders.echo"]
    effect: deny
    when: input.n == 13 && 1 / (input.n - 13) > 0
  - id: lab-approval
    capabilities: ["orders.echo"]
    effect: require_approval
    when: input.n == 42
    message: "Forty-two needs a second pair of eyes."
    approvers: '"manager" in approver.roles'
  - id: lab-hide
    capabilities: ["orders.secret"]
    effect: hide
    when: '!("admin" in actor.roles)'
limits:
  - id: lab-limited-notes
    capabilities: ["orders.echo"]
    when: has(input.note) && input.note == "limited"
    key: actor.tenant
    rate: 1/hour
    burst: 1
    message: "One limited note an hour; wait and try again."
"""


class EchoIn(BaseModel):
    n: Annotated[int, Field(ge=0)]
    note: str = ""


class EchoOut(BaseModel):
    n: int
    note: str = ""


class Lab:
    """Counts handler runs so tests can prove a handler did or did not run."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.inputs: list[Any] = []
        self.lock = threading.Lock()
        self.started = threading.Event()

    def ran(self, name: str, inp: Any = None) -> None:
        with self.lock:
            self.runs[name] = self.runs.get(name, 0) + 1
            self.inputs.append(inp)
        self.started.set()

    def count(self, name: str) -> int:
        return self.runs.get(name, 0)


def write_lab_policies(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lab.yaml").write_text(LAB_POLICIES)
    return folder


def build_lab(target: str, token: str, lab: Lab, **runtime: Any) -> warden.Runtime:
    rt = warden.Runtime(target, service="orders", token=token, **runtime)

    @rt.capability(
        "orders.echo",
        input=EchoIn,
        output=EchoOut,
        side_effect="read",
        errors={"NOT_ELIGIBLE": "This number cannot be echoed."},
    )
    def echo(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        lab.ran("echo", inp)
        if inp.note == "refuse":
            raise ctx.errors.NOT_ELIGIBLE(details={"hint": "use another note"})
        if inp.note == "explode":
            raise RuntimeError("database password is hunter2 at db.internal:5432")
        if inp.note == "lie":
            return {"n": "not a number"}  # type: ignore[return-value]
        if inp.note == "undeclared":
            raise warden.CapabilityError("SOMETHING_ELSE", "internal detail")
        return EchoOut(n=inp.n, note=inp.note)

    @rt.capability("orders.slow", input=EchoIn, output=EchoOut, side_effect="read", timeout_ms=200)
    def slow(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        lab.ran("slow", inp)
        time.sleep(inp.n / 1000)
        return EchoOut(n=inp.n)

    @rt.capability("orders.aslow", input=EchoIn, output=EchoOut, side_effect="read", timeout_ms=200)
    async def aslow(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        lab.ran("aslow", inp)
        await asyncio.sleep(inp.n / 1000)
        return EchoOut(n=inp.n)

    @rt.capability("orders.secret", input=EchoIn, output=EchoOut, side_effect="read")
    def secret(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        lab.ran("secret", inp)
        return EchoOut(n=inp.n)

    @rt.capability(
        "orders.mcp_only", input=EchoIn, output=EchoOut, side_effect="read", exposure=["mcp"]
    )
    def mcp_only(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        lab.ran("mcp_only", inp)
        return EchoOut(n=inp.n)

    @rt.capability(
        "orders.admin", input=EchoIn, output=EchoOut, side_effect="write", required_roles=["admin"]
    )
    def admin(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        lab.ran("admin", inp)
        return EchoOut(n=inp.n)

    return rt
