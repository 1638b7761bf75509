"""Three planes (replicas) on one PostgreSQL database: SDK clients spread over
them, an approval asked on one, approved on another and resumed on a third,
one idempotency key raced on all three, and one replica killed under load,
with nothing lost and one chain that verifies."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import warden
from benchmarks import free_port, wait_until_serving, warden_command
from benchmarks import start_plane as start_plane_process
from tests.conftest import ACTOR_SECRET, ORDERS_TOKEN, Plant, make_config
from tests.integration.guarantees.lab import Ledger, build_payments, write_guarantees_policies
from tests.integration.lab import Lab, build_lab, write_lab_policies
from tests.integration.outcome_load import start_client, wait_for_count
from tests.integration.test_replica_status import BROKEN, status_of, wait_for_status
from tests.integration.test_replica_status import warden as warden_cli
from tests.unit.approval_records import pending
from warden_server.app import serve
from warden_server.audit.reader import verify
from warden_server.auth.actors import mint_token
from warden_server.config import load_config
from warden_server.plane import Plane
from warden_server.store import StoreError

# Every replica is a plane of one process (set below), so these run once
# whatever counts WARDEN_TEST_PROCESSES lists.
pytestmark = pytest.mark.fixed_processes

REPLICAS = 3


@pytest.fixture
def replicas(tmp_path: Path, postgres_url: str) -> Iterator[Callable[[Path], list[Plant]]]:
    """Start three planes on one fresh database with these policies (or each
    with its own folder, given three)."""
    running: list[Any] = []

    def start(policies: Path | list[Path], **sections: Any) -> list[Plant]:
        plants = []
        folders = policies if isinstance(policies, list) else [policies] * REPLICAS
        for folder in folders:
            config = make_config(tmp_path, folder, store=postgres_url, processes=1)
            if sections:
                data = config.model_dump()
                for name, section in sections.items():
                    data[name] = {**(data.get(name) or {}), **section}
                config = type(config).model_validate(data)
            server = serve(Plane.from_config(config), "127.0.0.1:0")
            running.append(server)
            plants.append(Plant(server, tmp_path))
        return plants

    yield start
    for server in running:
        server.stop(grace=0)


def test_an_approval_asked_on_one_replica_is_approved_on_another_and_resumed_on_a_third(
    replicas: Callable[[Path], list[Plant]], tmp_path: Path
) -> None:
    a, b, c = replicas(write_lab_policies(tmp_path / "policies"))
    lab = Lab()
    on_a = build_lab(a.target, ORDERS_TOKEN, lab)
    on_c = build_lab(c.target, ORDERS_TOKEN, lab)
    on_a.register()
    watched: queue.Queue[warden.ApprovalEvent] = queue.Queue()
    watcher = warden.Approvals(a.target, token=a.token(sub="mia", roles=("manager",)))

    def pump() -> None:
        try:
            for event in watcher.watch():
                watched.put(event)
        except warden.ApprovalError:
            pass  # the plane stopped at teardown

    threading.Thread(target=pump, daemon=True).start()
    try:
        asked = on_a.invoke("orders.echo", {"n": 42, "note": "please"}, actor=a.token())
        assert asked.status == "suspended" and asked.approval_id
        with warden.Approvals(b.target, token=b.token(sub="mia", roles=("manager",))) as on_b:
            on_b.approve(asked.approval_id, reason="fine")
        heard = watched.get(timeout=30)
        while heard.type != "approved":  # the request itself may come first
            heard = watched.get(timeout=30)
        assert heard.approval.id == asked.approval_id
        resumed = on_c.invoke(
            "orders.echo",
            {"n": 42, "note": "please"},
            actor=c.token(),
            approval_id=asked.approval_id,
        )
        assert resumed.status == "succeeded", resumed
        assert lab.count("echo") == 1
        again = on_a.invoke(
            "orders.echo",
            {"n": 42, "note": "please"},
            actor=a.token(),
            approval_id=asked.approval_id,
        )
        assert again.status == "failed" and lab.count("echo") == 1
    finally:
        watcher.close()
        on_a.close()
        on_c.close()
    assert verify(b.server.plane.store).ok


def test_one_idempotency_key_raced_on_three_replicas_runs_the_handler_once(
    replicas: Callable[..., list[Plant]], tmp_path: Path
) -> None:
    plants = replicas(
        write_guarantees_policies(tmp_path / "guarantees"),
        idempotency={"replay_key": "test-replay-key-0123456789"},
    )
    ledger = Ledger()
    runtimes = [build_payments(p.target, ORDERS_TOKEN, ledger) for p in plants]
    runtimes[0].register()
    actor = plants[0].token()
    arguments = {"order_id": "A1", "amount": 120, "card": {"number": "4111111111111111",
                 "holder": "Ada"}, "note": "slow:300"}  # fmt: skip
    patient = warden.RetryPolicy(max_attempts=40, initial_backoff_ms=50, max_backoff_ms=200)
    barrier = threading.Barrier(REPLICAS * 2)
    results: list[warden.Envelope] = []

    def call(rt: warden.Runtime) -> None:
        barrier.wait()
        results.append(
            rt.invoke("orders.pay", arguments, actor=actor, idempotency_key="race", retry=patient)
        )

    threads = [threading.Thread(target=call, args=(rt,)) for rt in runtimes * 2]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        ledger.release.set()
        for rt in runtimes:
            rt.close()
    assert ledger.runs() == 1
    assert [e.status for e in results] == ["succeeded"] * REPLICAS * 2
    assert len({e.replayed_from or e.invocation_id for e in results}) == 1


CLIENTS = 3
CALLERS_PER_CLIENT = 4
CALLS_BEFORE_KILL = 60
CALLS_AFTER_RESTART = 60


@pytest.mark.heavy
def test_a_replica_killed_under_load_loses_nothing_and_the_chain_verifies(
    tmp_path: Path, postgres_url: str
) -> None:
    """Client processes call through the SDK, spread over three replicas; one
    replica is killed with SIGKILL mid-load and restarted. Every call whose
    caller saw ``succeeded`` has one outcome record, and ``warden audit verify``
    passes on the log the three wrote, then fails on an edited record."""
    write_lab_policies(tmp_path / "policies")
    config_file = tmp_path / "warden.toml"
    config_file.write_text(
        f"""
[server]
store = "{postgres_url}"
policies = "policies"
processes = 1

[actors]
hs256_secret = "{ACTOR_SECRET}"
issuer = "warden-test"
audience = "warden"

[services.orders]
token = "{ORDERS_TOKEN}"
namespaces = ["orders"]
"""
    )
    config = load_config(config_file, environ={})
    actor = mint_token(config, subject="bot-7", ttl_seconds=3600)
    ports = [free_port() for _ in range(REPLICAS)]
    stop = tmp_path / "stop"
    planes = [start_plane_process(config_file, port) for port in ports]
    clients: list[subprocess.Popen[bytes]] = []
    try:
        for plane, port in zip(planes, ports, strict=True):
            wait_until_serving(f"127.0.0.1:{port}", plane)
        for number in range(CLIENTS):
            clients.append(
                start_client(
                    f"127.0.0.1:{ports[number % REPLICAS]}",
                    tmp_path / f"outbox-{number}.sqlite",
                    actor,
                    CALLERS_PER_CLIENT,
                    stop,
                    tmp_path / f"client-{number}.jsonl",
                )
            )
        _await(postgres_url, "outcome", CALLS_BEFORE_KILL, clients)
        os.killpg(planes[0].pid, signal.SIGKILL)
        planes[0].wait()
        killed_at = _count(postgres_url, "decision")
        planes[0] = start_plane_process(config_file, ports[0])
        wait_until_serving(f"127.0.0.1:{ports[0]}", planes[0])
        _await(postgres_url, "decision", killed_at + CALLS_AFTER_RESTART, clients)
        stop.touch()
        for client in clients:
            assert client.wait(timeout=180) == 0, "a client could not drain its outbox"
    finally:
        stop.touch()
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.wait()
        for plane in planes:
            if plane.poll() is None:
                plane.terminate()
                plane.wait(timeout=30)

    answers = [
        json.loads(line)
        for number in range(CLIENTS)
        for line in (tmp_path / f"client-{number}.jsonl").read_text().splitlines()
    ]
    succeeded = {invocation_id for invocation_id, status, _ in answers if status == "succeeded"}
    with psycopg.connect(postgres_url) as conn:
        outcomes = Counter(
            row[0]
            for row in conn.execute("SELECT invocation_id FROM audit_events WHERE kind = 'outcome'")
        )
    assert succeeded and succeeded - set(outcomes) == set()
    assert [i for i, n in outcomes.items() if n > 1] == []
    verified = _verify(config_file)
    assert verified.returncode == 0 and "chain intact" in verified.stdout, verified
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE audit_events SET status = 'refused' WHERE seq = 40")
    tampered = _verify(config_file)
    assert tampered.returncode != 0 and "40" in tampered.stdout + tampered.stderr, tampered


def _verify(config_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*warden_command(), "audit", "verify", "--config", str(config_file)],
        capture_output=True,
        text=True,
        check=False,
    )


def _count(url: str, kind: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM audit_events WHERE kind = %s", (kind,)).fetchone()
        return int(row[0]) if row else 0


def _await(url: str, kind: str, at_least: int, clients: list[subprocess.Popen[bytes]]) -> None:
    wait_for_count(lambda: _count(url, kind), at_least, clients, f"{kind} records")


def test_policy_status_names_the_replica_serving_another_revision_and_the_one_refusing(
    replicas: Callable[..., list[Plant]], tmp_path: Path
) -> None:
    write_lab_policies(tmp_path / "policies")
    folders = [Path(shutil.copytree(tmp_path / "policies", tmp_path / name)) for name in "abc"]
    a, b, c = replicas(folders)
    lab = build_lab(a.target, ORDERS_TOKEN, Lab())
    lab.register()
    lab.close()
    with (folders[1] / "lab.yaml").open("a") as f:
        f.write("# a change only replica b has\n")
    assert b.server.plane.reloader.reload() == "loaded"
    (folders[2] / "broken.yaml").write_text(BROKEN)
    assert c.server.plane.reloader.reload() == "rejected"
    served = a.server.plane.policies.current().revision
    lagging = b.server.plane.policies.current().revision
    refused = c.server.plane.policies.status().rejected
    assert refused is not None and lagging != served

    data = wait_for_status(
        a,
        lambda d: (
            sorted(r["revision"] for r in d["replicas"]) == sorted([served, served, lagging])
            and any(r["rejected"] for r in d["replicas"])
        ),
    )
    by_id = {r["id"]: r for r in data["replicas"]}
    assert len(by_id) == 3
    assert by_id[a.server.plane.replica_id]["answering"]
    assert by_id[b.server.plane.replica_id]["revision"] == lagging
    assert by_id[b.server.plane.replica_id]["registrations"] == len(
        a.server.plane.registry.every_version()
    ), "the registrations it checked its set against"
    assert by_id[c.server.plane.replica_id]["rejected"]["revision"] == refused.revision
    assert by_id[c.server.plane.replica_id]["revision"] == served
    assert [r["leader"] for r in data["replicas"]].count(True) == 1

    text = status_of(a)
    assert text.exit_code == 1, "a refused change pending on any replica fails the command"
    assert "replicas: 3 replicas live, 1 serving another revision, 1 refusing a change" in (
        text.output
    )
    lines = {line.split(":")[0].strip(): line for line in text.output.splitlines()}
    assert "(another revision)" in lines[b.server.plane.replica_id]
    assert f"REFUSED {refused.revision[:12]}" in lines[c.server.plane.replica_id]
    assert "answering" in lines[a.server.plane.replica_id]

    metrics = a.server.plane.telemetry.metrics.exposition().decode()
    c_id = c.server.plane.replica_id
    assert (
        f'warden_replica_policy_info{{host="{c_id.split("/")[0]}",'
        f'refused_revision="{refused.revision}",replica="{c_id}",revision="{served}"}} 1.0'
    ) in metrics
    assert f'warden_replica_policy_info{{host="{c_id.split("/")[0]}",' in metrics
    assert metrics.count("warden_replica_leader{") == 3


def test_approval_expiry_runs_once_per_cluster_on_the_leading_replica(
    replicas: Callable[..., list[Plant]], tmp_path: Path, postgres_url: str
) -> None:
    plants = replicas(
        write_lab_policies(tmp_path / "policies"), server={"approval_sweep_seconds": 0.05}
    )
    store = plants[0].server.plane.store
    store.transact(lambda tx: tx.insert_approval(pending("due-since-2026")))
    deadline = time.monotonic() + 30
    while (approval := store.get_approval("due-since-2026")) and approval.state != "expired":
        assert time.monotonic() < deadline, "the approval never expired"
        time.sleep(0.05)
    sweeping = [p for p in plants if p.server.sweeper and p.server.sweeper.sweeps]
    assert len(sweeping) == 1, "only the replica holding the leader lock sweeps"
    with psycopg.connect(postgres_url) as conn:
        expired = conn.execute(
            "SELECT count(*) FROM audit_events WHERE kind = 'approval' AND status = 'expired'"
        ).fetchone()
    assert expired == (1,)


def test_another_replica_leads_when_the_leader_is_killed(tmp_path: Path, postgres_url: str) -> None:
    write_lab_policies(tmp_path / "policies")
    config_file = tmp_path / "warden.toml"
    config_file.write_text(
        f"""
[server]
store = "{postgres_url}"
policies = "policies"
processes = 1
replica_report_seconds = 0.2

[actors]
hs256_secret = "{ACTOR_SECRET}"
issuer = "warden-test"
audience = "warden"
"""
    )
    config = load_config(config_file, environ={})
    token = mint_token(config, subject="ann", roles=("policy-author",), ttl_seconds=3600)
    ports = [free_port() for _ in range(REPLICAS)]
    planes = [start_plane_process(config_file, port) for port in ports]
    try:
        for plane, port in zip(planes, ports, strict=True):
            wait_until_serving(f"127.0.0.1:{port}", plane)

        def leaders(port: int, live: int) -> list[dict[str, Any]]:
            deadline = time.monotonic() + 60
            while True:
                result = _policy_status(port, token)
                if len(result["replicas"]) == live:
                    leading = [r for r in result["replicas"] if r["leader"]]
                    if leading:
                        return leading
                assert time.monotonic() < deadline, f"no leader among {live}: {result}"
                time.sleep(0.1)

        (leader,) = leaders(ports[0], live=REPLICAS)
        by_id = {_policy_status(p, token)["answering"]: n for n, p in enumerate(ports)}
        killed = by_id[leader["id"]]
        os.killpg(planes[killed].pid, signal.SIGKILL)
        planes[killed].wait()
        survivor = ports[(killed + 1) % REPLICAS]
        (successor,) = leaders(survivor, live=REPLICAS - 1)
        assert successor["id"] != leader["id"]
    finally:
        for plane in planes:
            if plane.poll() is None:
                plane.terminate()
                plane.wait(timeout=30)


def _policy_status(port: int, token: str) -> dict[str, Any]:
    """``warden policy status --json`` of one replica, with the id of the one
    answering. The command runs in this process: the test polls it, and a
    fresh interpreter per poll cost more than the planes it watches."""
    result = warden_cli(
        "policy", "status", "--target", f"127.0.0.1:{port}", "--token", token, "--json"
    )  # fmt: skip
    data: dict[str, Any] = json.loads(result.stdout)
    data["answering"] = next((r["id"] for r in data["replicas"] if r["answering"]), "")
    return data


def test_only_the_leading_replica_publishes_anchors_even_as_it_stops(
    replicas: Callable[..., list[Plant]], tmp_path: Path
) -> None:
    """Anchors are the cluster's periodic work, done by the replica holding the
    leader lock: one that does not lead publishes nothing, at stop included."""
    anchors = tmp_path / "shared.anchors"
    plants = replicas(
        write_lab_policies(tmp_path / "policies"), audit={"anchor_file": str(anchors)}
    )
    leading = [p for p in plants if p.server.plane.store.leads()]
    assert len(leading) == 1
    for plant in plants:
        if plant is not leading[0]:
            plant.server.stop(grace=0)
    assert not anchors.exists() or anchors.read_text() == ""
    leading[0].server.stop(grace=0)
    (line,) = anchors.read_text().splitlines()
    assert json.loads(line)["seq"] >= 1


def test_approval_reads_fail_unavailable_within_a_deadline_while_the_database_is_down(
    replicas: Callable[..., list[Plant]], tmp_path: Path, postgres_url: str, postgres_server: Any
) -> None:
    """Reads fail as writes do when the database cannot be reached: UNAVAILABLE,
    before a caller's deadline, not a wait on the reader pool that outlives it."""
    plant = replicas(write_lab_policies(tmp_path / "policies"))[0]
    name = psycopg.conninfo.conninfo_to_dict(postgres_url)["dbname"]
    admin = postgres_server.url()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
    try:
        token = plant.token(sub="mia", roles=("manager",))
        with contextlib.closing(
            warden.Approvals(plant.target, token=token, timeout_ms=20_000)
        ) as approvals:
            # The first read may meet a pooled connection the database cut; the
            # next waits for the pool to connect again.
            for _ in range(2):
                with pytest.raises(warden.ApprovalError) as raised:
                    approvals.list()
                assert raised.value.status == "UNAVAILABLE", raised.value
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def test_a_replica_with_a_grant_or_replay_key_of_its_own_is_refused(
    tmp_path: Path, postgres_url: str
) -> None:
    """Each replica keeps its keys in files beside it (``var/warden.*``). One
    that made a grant key of its own would sign grants the others refuse the
    outcomes of; one with another replay key could not open their replays.
    Both are refused at start, in one line; a rotation that lists the new key
    on every replica first is not."""

    def config(folder: str, **grants: Any) -> Any:
        made = make_config(tmp_path / folder, store=postgres_url, processes=1)
        return made.model_copy(update={"grants": made.grants.model_copy(update=grants)})

    def copy(name: str, to: str) -> None:
        (tmp_path / to / "var").mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / "a" / "var" / f"warden.{name}", tmp_path / to / "var")

    Plane.from_config(config("a")).close()
    copy("integrity-key", "b")  # the one key the database itself checks
    with pytest.raises(StoreError, match=r"grant key .* is not a grant key the other replicas"):
        Plane.from_config(config("b"))
    copy("grant-key", "b")
    with pytest.raises(StoreError, match=r"the idempotency replay key .* is not the one"):
        Plane.from_config(config("b"))
    copy("replay-key", "b")
    Plane.from_config(config("b")).close()
    # Rotation: the new key (c's own) is accepted by a replica first, then signs.
    copy("integrity-key", "c")
    copy("replay-key", "c")
    new_key = tmp_path / "c" / "var" / "warden.grant-key"
    with pytest.raises(StoreError, match="is not a grant key"):
        Plane.from_config(config("c"))
    Plane.from_config(config("a", verification_key_files=[str(new_key)])).close()
    Plane.from_config(config("c")).close()
