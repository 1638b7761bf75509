"""Fixtures for the execution guarantees: a plane with the payments policies
(optionally on an injected clock) and the payments service registered with it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import warden
from tests.conftest import ORDERS_TOKEN, Plant, make_config, one_process
from tests.integration.approving import Clock
from tests.integration.guarantees.lab import Ledger, build_payments, write_guarantees_policies
from warden_server.app import Server, serve
from warden_server.config import Config
from warden_server.plane import Plane


def guarantees_config(tmp_path: Path, **sections: dict[str, Any]) -> Config:
    """The test config with the payments policies; ``sections`` replace whole
    sections (``server`` keys are merged)."""
    server = sections.pop("server", {})
    config = make_config(tmp_path, write_guarantees_policies(tmp_path / "guarantees"), **server)
    data = config.model_dump()
    data.update(sections)
    return Config.model_validate(data)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def launch(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Plant]]:
    """Start planes with the payments policies; every one is stopped at teardown."""
    servers: list[Server] = []

    def start(clock: Callable[[], datetime] | None = None, **sections: dict[str, Any]) -> Plant:
        if clock is not None or one_process(request):
            # A test clock cannot cross a process boundary: such a plane is one process.
            sections["server"] = {**sections.get("server", {}), "processes": 1}
        config = guarantees_config(tmp_path, **sections)
        plane = Plane.from_config(config, clock=clock) if clock else Plane.from_config(config)
        running = serve(plane, "127.0.0.1:0")
        servers.append(running)
        return Plant(running, tmp_path)

    yield start
    for running in servers:
        running.stop(grace=0)


@pytest.fixture
def pay_plant(launch: Callable[..., Plant], clock: Clock) -> Plant:
    return launch(clock=clock, idempotency={"replay_key": "test-replay-key-0123456789"})


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


@pytest.fixture
def payments(pay_plant: Plant, ledger: Ledger) -> Iterator[warden.Runtime]:
    rt = build_payments(pay_plant.target, ORDERS_TOKEN, ledger)
    rt.register()
    yield rt
    ledger.release.set()
    rt.close()
