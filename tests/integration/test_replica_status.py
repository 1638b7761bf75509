"""What each replica serves, shown by `warden policy status`: a plane on
SQLite shows itself (three replicas on PostgreSQL: ``test_replicas.py``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from tests.conftest import Plant
from tests.integration.lab import write_lab_policies
from warden_server.cli import main

BROKEN = "rules:\n  - id: broken\n    effect: deny\n    when: input.n >\n"


def warden(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def status_of(plant: Plant, *flags: str) -> Result:
    return warden(
        "policy", "status", "--target", plant.target,
        "--token", plant.token(sub="ann", roles=("policy-author",)), *flags,
    )  # fmt: skip


def wait_for_status(plant: Plant, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The status once ``ready`` holds for it (replicas report on their own thread)."""
    deadline = time.monotonic() + 30
    while True:
        data = json.loads(status_of(plant, "--json").stdout)
        if ready(data):
            return data
        assert time.monotonic() < deadline, f"the status never settled: {data}"
        time.sleep(0.05)


def test_a_plane_on_sqlite_shows_itself_as_its_one_replica(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    plant = start_plane(write_lab_policies(tmp_path / "policies"))
    data = json.loads(status_of(plant, "--json").stdout)
    (only,) = data["replicas"]
    assert only["id"] == plant.server.plane.replica_id
    assert only["revision"] == data["current"]["revision"]
    assert only["answering"] and only["leader"] and only["rejected"] is None
    assert only["processes"] == plant.config.process_count
    text = status_of(plant)
    assert text.exit_code == 0, text.output
    assert f"replicas: 1 replica live\n  {only['id']}: revision" in text.output
