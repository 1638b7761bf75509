"""The audit API (SI-13): only auditors read, scoped to their tenant unless they
hold auditor:all, and every read is itself recorded; the CLI reads through it
with --target and --token and prints what it prints for the store file."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner, Result

from tests.conftest import Plant, make_config
from tests.integration import auditlog
from warden.shared.canonical import compact_json
from warden.v1 import audit_pb2, audit_pb2_grpc
from warden_server.app import serve
from warden_server.audit import reader
from warden_server.cli import main
from warden_server.config import ConfigError, config_from_dict
from warden_server.plane import Plane


@pytest.fixture
def seeded(start_plane: Callable[..., Plant], tmp_path: Path) -> Plant:
    """A plane over the known log: written first, so its records keep their
    sequence numbers; the plane's own records (its policy load) come after."""
    auditlog.seeded_store(tmp_path / "warden.db")
    return start_plane()


@pytest.fixture
def stub(seeded: Plant) -> Iterator[audit_pb2_grpc.AuditStub]:
    with grpc.insecure_channel(seeded.target) as channel:
        yield audit_pb2_grpc.AuditStub(channel)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def auditor(plant: Plant, tenant: str = "acme", *roles: str) -> str:
    return plant.token(sub=f"auditor-{tenant or 'all'}", roles=roles or ("auditor",), tenant=tenant)


def everyone(plant: Plant) -> str:
    return plant.token(sub="chief", roles=("auditor:all",), tenant="")


def seqs(response: audit_pb2.QueryResponse) -> list[int]:
    return [r.seq for r in response.records]


def access_records(plant: Plant) -> list[dict[str, Any]]:
    return plant.events(kind="access")


def query(stub: audit_pb2_grpc.AuditStub, token: str, **filters: Any) -> audit_pb2.QueryResponse:
    request = audit_pb2.QueryRequest(filter=audit_pb2.AuditFilter(**filters), limit=1000)
    response: audit_pb2.QueryResponse = stub.Query(request, metadata=bearer(token))
    return response


def refused(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        result = call()
        if not isinstance(result, audit_pb2.QueryResponse | audit_pb2.StatsResponse):
            list(result)  # a stream answers while it is read
    return raised.value


# -- who may read --------------------------------------------------------------


def test_si13_actors_without_the_auditor_role_are_refused_and_recorded(
    seeded: Plant, stub: audit_pb2_grpc.AuditStub
) -> None:
    support = seeded.token(sub="eve", roles=("support", "admin"), tenant="acme")
    error = refused(lambda: query(stub, support))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "needs the role auditor" in (error.details() or "")
    (record,) = access_records(seeded)
    assert (record["status"], record["actor_id"], record["code"]) == ("denied", "eve", "FORBIDDEN")
    assert record["reason"].startswith("audit.query: ")


def refusals_recorded(records: list[dict[str, Any]]) -> int:
    """How many refusals the records account for: one each, or a summary's count."""
    return sum(
        json.loads(r["input"])["refused"] if r["reason"].startswith("audit.refused") else 1
        for r in records
    )


def test_si13_no_token_or_a_bad_token_is_unauthenticated_and_recorded(
    seeded: Plant, stub: audit_pb2_grpc.AuditStub
) -> None:
    for metadata in ((), bearer("not-a-jwt"), (("authorization", "Basic abc"),)):
        error = refused(
            lambda m=metadata: stub.Query(audit_pb2.QueryRequest(), metadata=m)  # type: ignore[misc]
        )
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    first, *_ = access_records(seeded)  # the first of a window is recorded at once
    assert (first["status"], first["actor_id"], first["code"]) == (
        "rejected",
        None,
        "UNAUTHENTICATED",
    )
    seeded.server.stop()  # the rest are recorded together at the window's end, or at stop
    records = access_records(seeded)
    assert {(r["status"], r["actor_id"], r["code"]) for r in records} == {
        ("rejected", None, "UNAUTHENTICATED")
    }
    assert refusals_recorded(records) == 3


def test_si13_unauthenticated_reads_cost_no_fsync_and_no_storage_each(
    seeded: Plant, stub: audit_pb2_grpc.AuditStub
) -> None:
    """A flood of anonymous reads with large filters leaves a bounded trace:
    a record for the first refusal of a window and one summary, not one each."""
    size_before = seeded.db_path.stat().st_size
    big = audit_pb2.QueryRequest(
        filter=audit_pb2.AuditFilter(actor="a" * 4000, capabilities=["orders.*"] * 50)
    )
    for _ in range(300):
        assert refused(lambda: stub.Query(big)).code() == grpc.StatusCode.UNAUTHENTICATED
    assert len(access_records(seeded)) <= seeded.config.process_count
    seeded.server.stop()
    records = access_records(seeded)
    assert len(records) <= 2 * seeded.config.process_count
    assert refusals_recorded(records) == 300
    assert all(len(r["input"]) < 2_000 for r in records)
    wal = seeded.db_path.with_name(seeded.db_path.name + "-wal")
    grown = seeded.db_path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    assert grown - size_before < 200_000


def test_si13_an_authenticated_read_records_its_filter_bounded_with_a_digest(
    seeded: Plant, stub: audit_pb2_grpc.AuditStub
) -> None:
    # The largest filter the plane takes: 32 patterns, texts of 256 characters.
    patterns = [f"orders.{i}" + "x" * 240 + "*" for i in range(32)]
    query(stub, everyone(seeded), actor="x" * 256, capabilities=patterns)
    (record,) = access_records(seeded)
    kept = json.loads(record["input"])
    assert kept["actor"] == "x" * 256
    assert kept["capabilities"][:16] == patterns[:16] and len(kept["capabilities"]) == 17
    whole = {"actor": "x" * 256, "capabilities": patterns, "limit": 1000}
    assert kept["request_sha256"] == hashlib.sha256(compact_json(whole).encode()).hexdigest()


def test_audit_reads_over_a_callers_rate_are_resource_exhausted_with_retry_info(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path)
    config = config.model_copy(
        update={"audit": config.audit.model_copy(update={"read_rate": 0.01, "read_burst": 3})}
    )
    with serve(Plane.from_config(config), "127.0.0.1:0") as server:
        plant = Plant(server, tmp_path)
        token = everyone(plant)
        with grpc.insecure_channel(plant.target) as channel:
            stub = audit_pb2_grpc.AuditStub(channel)
            for _ in range(3):
                query(stub, token)
            for _ in range(20):
                error = refused(lambda: query(stub, token))
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "over its rate of audit reads" in (error.details() or "")
            trailers = dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
            assert int(trailers["retry-after-ms"]) > 1000
            other = plant.token(sub="other", roles=("auditor:all",), tenant="")
            query(stub, other)  # the limit is per caller
        server.stop()
        records = access_records(plant)
    allowed = [r for r in records if r["status"] == "allowed"]
    limited = [r for r in records if r["status"] == "limited"]
    assert len(allowed) == 4
    assert len(limited) <= 2 and refusals_recorded(limited) == 20
    assert {r["code"] for r in limited} == {"RATE_LIMITED"}


def test_si13_an_auditor_without_a_tenant_needs_auditor_all(
    seeded: Plant, stub: audit_pb2_grpc.AuditStub
) -> None:
    error = refused(lambda: query(stub, auditor(seeded, "")))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "without a tenant needs auditor:all" in (error.details() or "")


# -- what they see -------------------------------------------------------------------


def test_si13_an_auditor_sees_only_their_tenant(
    seeded: Plant, stub: audit_pb2_grpc.AuditStub
) -> None:
    token = auditor(seeded, "acme")
    seen = query(stub, token, kind="decision")
    assert seqs(seen) == auditlog.expected_seqs(
        lambda r: r["tenant"] == "acme" and r["kind"] == "decision"
    )
    assert {r.tenant for r in seen.records} == {"acme"}
    everything = query(stub, token)
    assert {r.tenant for r in everything.records} == {"acme"}
    stats = stub.Stats(audit_pb2.StatsRequest(by="actor"), metadata=bearer(token))
    assert {row.key for row in stats.rows} == {"alice", "bob", "auditor-acme"}
    exported = list(stub.Export(audit_pb2.ExportRequest(), metadata=bearer(token)))
    assert exported and {r.tenant for r in exported} == {"acme"}


def test_si13_asking_for_another_tenant_is_refused_not_emptied(
    seeded: Plant, stub: audit_pb2_grpc.AuditStub
) -> None:
    error = refused(lambda: query(stub, auditor(seeded, "acme"), tenant="globex"))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "may read tenant 'acme' only" in (error.details() or "")
    assert access_records(seeded)[-1]["status"] == "denied"
    export = audit_pb2.ExportRequest(filter=audit_pb2.AuditFilter(tenant="globex"))
    token = auditor(seeded, "acme")
    assert (
        refused(lambda: stub.Export(export, metadata=bearer(token))).code()
        == grpc.StatusCode.PERMISSION_DENIED
    )


def test_si13_auditor_all_sees_every_tenant_and_untenanted_records(
    seeded: Plant, stub: audit_pb2_grpc.AuditStub
) -> None:
    seen = query(stub, everyone(seeded), kind="decision")
    assert seqs(seen) == auditlog.expected_seqs(lambda r: r["kind"] == "decision")
    assert {r.tenant if r.HasField("tenant") else None for r in seen.records} == {
        "acme",
        "globex",
        None,
    }


def test_si13_verify_reads_every_tenant_so_it_needs_auditor_all(
    seeded: Plant, stub: audit_pb2_grpc.AuditStub
) -> None:
    error = refused(
        lambda: stub.Verify(audit_pb2.VerifyRequest(), metadata=bearer(auditor(seeded)))
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    result = stub.Verify(audit_pb2.VerifyRequest(), metadata=bearer(everyone(seeded)))
    assert result.ok and result.first_bad_seq == 0
    # and the plane's policy load and both access records
    assert result.checked == len(auditlog.LOG) + 3


def test_si13_every_read_is_recorded_before_it_is_answered(
    seeded: Plant, stub: audit_pb2_grpc.AuditStub
) -> None:
    token = auditor(seeded, "acme")
    query(stub, token, capabilities=["orders.*"], since="2026-03-01")
    stub.Stats(audit_pb2.StatsRequest(by="stage"), metadata=bearer(token))
    list(stub.Export(audit_pb2.ExportRequest(), metadata=bearer(token)))
    records = access_records(seeded)
    assert [(r["reason"], r["status"], r["actor_id"], r["tenant"]) for r in records] == [
        ("audit.query", "allowed", "auditor-acme", "acme"),
        ("audit.stats", "allowed", "auditor-acme", "acme"),
        ("audit.export", "allowed", "auditor-acme", "acme"),
    ]
    assert json.loads(records[0]["input"]) == {
        "capabilities": ["orders.*"],
        "since": "2026-03-01",
        "limit": 1000,
    }
    assert json.loads(records[1]["input"]) == {"by": "stage"}
    answer = query(stub, token)
    assert (answer.records[0].kind, answer.records[0].reason) == ("access", "audit.query"), (
        "the read's own record is committed before the answer"
    )


def test_the_audit_api_answers_private_diagnostics_to_auditors(
    lab_plant: Plant, lab_rt: Any
) -> None:
    env = lab_rt.invoke("orders.echo", {"n": 1, "note": "explode"}, actor=lab_plant.token())
    assert lab_rt.flush(timeout_ms=10_000) == 0
    with grpc.insecure_channel(lab_plant.target) as channel:
        response = query(
            audit_pb2_grpc.AuditStub(channel),
            auditor(lab_plant, "acme"),
            invocation_id=env.invocation_id,
            kind="outcome",
        )
    (record,) = response.records
    assert "hunter2" in record.cause_message and record.cause_type == "builtins.RuntimeError"


def test_a_bad_filter_is_invalid_argument(seeded: Plant, stub: audit_pb2_grpc.AuditStub) -> None:
    error = refused(lambda: query(stub, everyone(seeded), since="last tuesday"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "neither an ISO 8601 time" in (error.details() or "")
    error = refused(lambda: query(stub, everyone(seeded), since="1h", until="2h"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not before until '2h'" in (error.details() or "")
    bad_page = audit_pb2.QueryRequest(page_token="abc")
    error = refused(lambda: stub.Query(bad_page, metadata=bearer(everyone(seeded))))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- the CLI through the API ---------------------------------------------------------------


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_the_cli_reads_through_the_api_as_it_reads_the_store(seeded: Plant) -> None:
    store = ["--config", "no-such.toml", "--store", str(seeded.db_path)]
    remote = ["--target", seeded.target, "--token", everyone(seeded)]
    for command in (
        ["query", "--json", "--kind", "decision", "--capability", "orders.*"],
        ["query", "--stage", "policy"],
        ["stats", "--by", "code", "--kind", "decision", "--json"],
        ["export", "--kind", "outcome"],
    ):
        local = cli("audit", *command, *store)
        through_api = cli("audit", *command, *remote)
        assert local.exit_code == through_api.exit_code == 0, through_api.output
        assert through_api.stdout == local.stdout
    verified = cli("audit", "verify", *remote)
    assert verified.exit_code == 0 and verified.stdout.startswith("ok: ")


def test_the_cli_pages_through_the_api(seeded: Plant) -> None:
    remote = ["--target", seeded.target, "--token", everyone(seeded)]
    first = cli("audit", "query", "--json", "--limit", "4", "--kind", "decision", *remote)
    cursor = first.stderr.split("--before")[1].strip()
    second = cli("audit", "query", "--json", "--limit", "100", "--kind", "decision",
                 "--before", cursor, *remote)  # fmt: skip
    got = [json.loads(line)["seq"] for line in (first.stdout + second.stdout).splitlines()]
    assert got == auditlog.expected_seqs(lambda r: r["kind"] == "decision")


def test_the_cli_reports_refusals_in_one_line(seeded: Plant) -> None:
    token = seeded.token(sub="eve", roles=("support",), tenant="acme")
    result = cli("audit", "query", "--target", seeded.target, "--token", token)
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"Error: {seeded.target} answered PERMISSION_DENIED: "
        "reading the audit log needs the role auditor"
    )
    missing = cli("audit", "query", "--target", seeded.target)
    assert missing.exit_code == 2 and "--token" in missing.output


def test_verify_that_could_not_check_exits_3_never_a_verdict_s_status(seeded: Plant) -> None:
    """``verify`` exits 1 for tampered and 2 for damaged: a refusal (here a
    tenant's auditor, where verifying needs auditor:all) left the log
    unchecked, and says so with 3, whatever status click would give."""
    token = seeded.token(sub="ann", roles=("auditor",), tenant="acme")
    refused = cli("audit", "verify", "--target", seeded.target, "--token", token)
    assert refused.exit_code == 3
    assert "answered PERMISSION_DENIED" in refused.output and "auditor:all" in refused.output
    unusable = cli("audit", "verify", "--target", seeded.target, "--anchor", "1:nope")
    assert unusable.exit_code == 3 and "SEQ:HASH" in unusable.output


# -- scheduled retention --------------------------------------------------------------


def test_the_plane_prunes_on_schedule_and_still_verifies(tmp_path: Path) -> None:
    from tests.integration.test_audit_cli import ed25519_pem

    key = ed25519_pem(tmp_path / "checkpoint.pem")
    base = make_config(tmp_path).model_dump(mode="json", exclude={"base_dir"})
    base["audit"] = {"retention": "1d", "prune_interval": "1h", "checkpoint_key_file": str(key)}
    auditlog.seeded_store(tmp_path / "warden.db")  # months old by the time the plane starts
    with serve(
        Plane.from_config(config_from_dict(base, base_dir=tmp_path)), "127.0.0.1:0"
    ) as server:
        store = server.plane.store
        assert server.retention is not None
        server.retention.run_once()
        # (The scheduler's own first run, at start, may also have found something.)
        remaining = list(store.audit_records())
        assert remaining[0]["kind"] == "policy", "the plane's own policy load is recent: it stays"
        assert {r["kind"] for r in remaining[1:]} == {"retention"}
        checkpoint = store.audit_checkpoint()
        assert checkpoint is not None and checkpoint.seq >= len(auditlog.LOG)
        assert reader.verify(store, server.plane.checkpoints).ok


@pytest.mark.fixed_processes
def test_retention_without_a_private_key_is_refused_at_start(tmp_path: Path) -> None:
    base = make_config(tmp_path).model_dump(mode="json", exclude={"base_dir"})
    base["audit"] = {"retention": "1d"}
    with pytest.raises(ConfigError) as raised:
        config_from_dict(base, base_dir=tmp_path)
    assert "retention needs checkpoint_key_file" in str(raised.value)
