"""The example policies' capabilities snapshot stays the example service's.

`make test` type-checks `policies/` offline against `policies/capabilities.json`;
were the snapshot to drift from what `examples/orders` registers, that check
would vouch for schemas no plane serves.
"""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from tests.conftest import EXAMPLE_POLICIES, Plant
from warden_server.cli import main


def test_the_example_snapshot_is_what_the_example_service_registers(
    plant: Plant, orders: Any
) -> None:
    out = plant.tmp_path / "capabilities.json"
    result = CliRunner().invoke(
        main, ["policy", "capabilities", "--store", str(plant.db_path), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    kept = json.loads((EXAMPLE_POLICIES / "capabilities.json").read_text())
    assert kept == json.loads(out.read_text()), (
        "policies/capabilities.json is stale: regenerate it with `warden policy capabilities "
        "--target HOST:PORT --out policies/capabilities.json` against a plane the example "
        "service registered with"
    )
