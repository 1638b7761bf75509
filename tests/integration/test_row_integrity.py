"""A registry row edited in the store file is refused and reported, never
enforced: the plane that reads it fails closed, the log and the audit log say
which row, and ``warden audit verify`` names it."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
from click.testing import CliRunner

from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.lab import Lab, build_lab, write_lab_policies
from warden.v1 import governor_pb2, governor_pb2_grpc
from warden_server.cli import main


def begin(plant: Plant, arguments: str) -> governor_pb2.BeginResponse:
    with grpc.insecure_channel(plant.target) as channel:
        response: governor_pb2.BeginResponse = governor_pb2_grpc.GovernorStub(channel).Begin(
            governor_pb2.BeginRequest(
                invocation_id=str(uuid.uuid4()),
                capability_id="orders.echo",
                actor_token=plant.token(),
                input_json=arguments,
            ),
            metadata=(("x-warden-service-token", ORDERS_TOKEN),),
            timeout=10,
        )
    return response


def test_a_tampered_schema_is_refused_and_reported_never_enforced(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    policies = write_lab_policies(tmp_path / "lab")
    plant = start_plane(policies)
    runtime = build_lab(plant.target, ORDERS_TOKEN, Lab())
    runtime.register()
    runtime.close()
    refused = begin(plant, '{"n": -5}')
    assert refused.failure.code == "INPUT_INVALID"
    plant.server.stop()
    # One edit of the stored schema, as with a SQLite shell: the minimum of n goes.
    conn = sqlite3.connect(plant.db_path)
    edited = conn.execute(
        "UPDATE capabilities SET definition = replace(definition, '\"minimum\": 0', "
        "'\"minimum\": -1000') WHERE id = 'orders.echo'"
    )
    assert edited.rowcount == 1
    conn.commit()
    conn.close()

    again = start_plane(policies)
    try:
        answer = begin(again, '{"n": -5}')
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.UNAVAILABLE
    else:
        raise AssertionError(f"the tampered schema was used: {answer}")
    reported = again.events(kind="integrity")  # once by each process that read it
    assert 1 <= len(reported) <= again.config.process_count
    assert {(r["status"], r["reason"]) for r in reported} == {
        (
            "tampered",
            "capabilities row orders.echo@1 fails its integrity check: "
            "it was changed outside the plane",
        )
    }
    assert not [e for e in again.events(kind="decision", status="granted")]
    verified = CliRunner().invoke(main, ["audit", "verify", "--store", str(again.db_path)])
    assert verified.exit_code == 1, verified.output
    assert verified.output.startswith("TAMPERED: capabilities row orders.echo@1 fails")
