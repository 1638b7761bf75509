"""The example policies' capabilities snapshot stays the example service's.

`make test` type-checks `policies/` offline against `policies/capabilities.json`;
were the snapshot to drift from what `examples/orders` registers, that check
would vouch for schemas no plane serves.
"""

from __future__ import annotations

import json
from pathlib import Path
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


def test_policy_test_reads_the_capabilities_from_a_plane_or_its_store(
    plant: Plant, orders: Any, tmp_path: Path
) -> None:
    """The same sources as `check`: a running plane (with a token) or its
    store. A folder without a snapshot, whose case relies on orders.get being
    a read and on its input schema, passes only with the registered facts."""
    folder = tmp_path / "policies"
    (folder / "tests").mkdir(parents=True)
    (folder / "rules.yaml").write_text(
        "rules:\n"
        "  - id: reads-are-free\n"
        '    capabilities: ["orders.*"]\n'
        "    effect: allow\n"
        '    when: capability.side_effect == "read"\n'
    )
    (folder / "tests" / "reads.yaml").write_text(
        "tests:\n"
        "  - name: a look-up reads\n"
        "    capability: orders.get\n"
        "    input: {order_id: A1}\n"
        "    expect: {effect: allow, rule: reads-are-free}\n"
        "  - name: a look-up needs an order id\n"
        "    capability: orders.get\n"
        "    input: {}\n"
        "    expect: {effect: allow}\n"
    )
    runner = CliRunner()
    token = plant.token(roles=("policy-author",))
    for source in (["--target", plant.target, "--token", token], ["--store", str(plant.db_path)]):
        result = runner.invoke(main, ["policy", "test", str(folder), *source])
        assert result.exit_code == 1, result.output
        assert "PASS  a look-up reads" in result.stdout
        assert "FAIL  a look-up needs an order id" in result.stdout
        assert "the plane refuses the input (INPUT_INVALID): /order_id: is required" in (
            result.stdout
        )
    alone = runner.invoke(main, ["policy", "test", str(folder)])
    assert "FAIL  a look-up reads" in alone.stdout  # made-up facts: a write
