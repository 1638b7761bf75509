"""The laboratory service, as a model reaches it through the adapters: the lab's
capabilities plus one with a model-hidden output field and one exposed only
for direct calls."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from pydantic import BaseModel

import warden
from tests.integration.lab import EchoIn, Lab, build_lab


class ProfileOut(BaseModel):
    n: int
    ledger_ref: Annotated[str, warden.ModelHidden]


def build_adapter_lab(target: str, token: str, lab: Lab, **runtime: Any) -> warden.Runtime:
    """The lab without automatic retries, so that each call is one attempt."""
    rt = build_lab(target, token, lab, retry=warden.NO_RETRY, **runtime)

    @rt.capability("orders.profile", input=EchoIn, output=ProfileOut, side_effect="read")
    def profile(inp: EchoIn, ctx: warden.Context) -> ProfileOut:
        """Reads a number's profile."""
        lab.ran("profile", inp)
        return ProfileOut(n=inp.n, ledger_ref=f"ledger-{inp.n}-internal")

    @rt.capability(
        "orders.direct_only",
        input=EchoIn,
        output=ProfileOut,
        side_effect="read",
        exposure=["direct"],
    )
    def direct_only(inp: EchoIn, ctx: warden.Context) -> ProfileOut:
        lab.ran("direct_only", inp)
        return ProfileOut(n=inp.n, ledger_ref="")

    @rt.capability("orders.wait", input=EchoIn, output=EchoIn, side_effect="read")
    async def wait(inp: EchoIn, ctx: warden.Context) -> EchoIn:
        """Waits n milliseconds, within the plane's default budget, until cancelled."""
        lab.ran("wait", inp)
        await asyncio.sleep(inp.n / 1000)
        return inp

    return rt
