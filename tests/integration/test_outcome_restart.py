"""No outcome is lost across a restart of the plane: grants outlive it (the
grant key persists beside the store), a report is taken whenever it arrives,
and a report repeated because its answer was lost is never recorded twice."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sqlite3
import stat
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

import warden
from benchmarks import free_port, wait_until_serving, warden_command
from benchmarks import start_plane as start_plane_process
from tests.conftest import ACTOR_SECRET, ORDERS_TOKEN, Plant, make_config, processes
from tests.integration.lab import EchoIn, EchoOut, Lab, build_lab, write_lab_policies
from tests.integration.outcome_load import start_client, wait_for_count
from tests.integration.test_rpc_input import (
    ORDERS,
    Stubs,
    assert_chain_intact,
    begin_grant,
    complete_request,
    invocation_state,
    open_stubs,
)
from warden_server.app import serve
from warden_server.auth.actors import mint_token
from warden_server.config import load_config
from warden_server.plane import Plane
from warden_server.records.query import RecordFilter


def lab_plane(start_plane: Callable[..., Plant], tmp_path: Path) -> Plant:
    """A lab plane with the lab capabilities registered (by a runtime closed since)."""
    plant = start_plane(write_lab_policies(tmp_path / "lab-policies"))
    rt = build_lab(plant.target, ORDERS_TOKEN, Lab())
    try:
        rt.register()
    finally:
        rt.close()
    return plant


def test_a_report_after_a_restart_is_taken_with_the_default_grant_key(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    before = lab_plane(start_plane, tmp_path)
    with open_stubs(before) as stubs:
        invocation_id, token = begin_grant(stubs, before)
    before.server.stop(grace=0)

    after = start_plane(write_lab_policies(tmp_path / "lab-policies"))  # the same store
    with open_stubs(after) as stubs:
        response = stubs.governor.Complete(
            complete_request(invocation_id, token), metadata=ORDERS, timeout=10
        )
    (row,) = after.events(kind="outcome")
    assert (row["seq"], row["invocation_id"]) == (response.audit_seq, invocation_id)
    assert invocation_state(after, invocation_id) == "completed"
    key_file = tmp_path / "warden.db.grant-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert_chain_intact(after)


def test_a_repeated_report_is_answered_with_the_record_of_the_first(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    plant = lab_plane(start_plane, tmp_path)
    with open_stubs(plant) as stubs:
        invocation_id, token = begin_grant(stubs, plant)
        request = complete_request(invocation_id, token)
        first = stubs.governor.Complete(request, metadata=ORDERS, timeout=10)
        again = stubs.governor.Complete(request, metadata=ORDERS, timeout=10)
    assert again.audit_seq == first.audit_seq
    (row,) = plant.events(kind="outcome")
    assert row["seq"] == first.audit_seq
    assert_chain_intact(plant)


def test_one_report_sent_many_times_at_once_is_recorded_once(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    """Which report completes an invocation is decided in the store's write, so
    copies racing through several connections (several plane processes, when
    the plane serves with them) all get the one record."""
    plant = lab_plane(start_plane, tmp_path)
    with open_stubs(plant) as stubs:
        invocation_id, token = begin_grant(stubs, plant)
    request = complete_request(invocation_id, token)
    answers: list[int] = []
    lock = threading.Lock()

    def report() -> None:
        channel = grpc.insecure_channel(
            plant.target, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        try:
            seq = Stubs(channel).governor.Complete(request, metadata=ORDERS, timeout=10).audit_seq
        finally:
            channel.close()
        with lock:
            answers.append(seq)

    threads = [threading.Thread(target=report) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (row,) = plant.events(kind="outcome")
    assert answers == [row["seq"]] * 12
    assert_chain_intact(plant)


# -- through the SDK: the outbox keeps each report until the plane takes it ------


def test_an_idempotent_call_whose_report_outlived_a_restart_answers_its_outcome(
    tmp_path: Path,
) -> None:
    """The plane goes away while the handler runs and the service stops before
    it is back: the report waits in the outbox file, the next run sends it to
    the restarted plane, and a repeat of the key replays the real outcome."""
    config = make_config(tmp_path, write_lab_policies(tmp_path / "policies"))
    listen = f"127.0.0.1:{free_port()}"
    servers = [serve(Plane.from_config(config), listen)]
    outbox = tmp_path / "orders-outbox.sqlite"
    actor = mint_token(config, subject="bot-7")
    shipped: list[int] = []

    def runtime() -> warden.Runtime:
        # Closing with the plane away waits this long for it in vain; shorter
        # than 2 s, a Register or Begin on a busy two-core machine can miss it.
        rt = warden.Runtime(
            listen, service="orders", token=ORDERS_TOKEN, outbox=outbox, governance_timeout_ms=2_000
        )

        @rt.capability("orders.ship", input=EchoIn, output=EchoOut, side_effect="write")
        def ship(inp: EchoIn, ctx: warden.Context) -> EchoOut:
            shipped.append(inp.n)
            servers[-1].stop(grace=0)  # the plane goes away while the handler runs
            return EchoOut(n=inp.n, note=f"shipment {len(shipped)}")

        return rt

    first = runtime()
    try:
        env = first.invoke("orders.ship", {"n": 7}, actor=actor, idempotency_key="ship-7")
    finally:
        first.close()  # the plane is still away: the report stays in the file
    assert env.status == "succeeded"
    assert len(reports_in(outbox)) == 1
    assert stat.S_IMODE(outbox.stat().st_mode) == 0o600

    servers.append(serve(Plane.from_config(config), listen))
    second = runtime()
    try:
        assert second.flush(timeout_ms=30_000) == 0  # the earlier run's report, taken
        again = second.invoke("orders.ship", {"n": 7}, actor=actor, idempotency_key="ship-7")
        records = list(
            servers[-1].plane.store.audit_records(RecordFilter(invocation_id=env.invocation_id))
        )
    finally:
        second.close()
        servers[-1].stop(grace=0)
    assert (again.status, again.replayed_from) == ("succeeded", env.invocation_id)
    assert again.output == EchoOut(n=7, note="shipment 1")
    assert shipped == [7]
    assert reports_in(outbox) == []
    # The report kept the trace of its invocation through the file and the next run.
    assert [r["kind"] for r in records] == ["decision", "outcome"]
    assert records[0]["trace_id"] == records[1]["trace_id"]


def test_the_default_outbox_is_a_file_per_service_for_its_owner_alone(
    lab_plant: Plant, lab: Lab, outbox_home: Path
) -> None:
    rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab)
    try:
        env = rt.invoke("orders.echo", {"n": 1}, actor=lab_plant.token())
        assert rt.flush(timeout_ms=10_000) == 0
    finally:
        rt.close()
    assert rt.outbox_path == outbox_home / "warden" / "outbox-orders.sqlite"
    assert stat.S_IMODE(rt.outbox_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(rt.outbox_path.parent.stat().st_mode) == 0o700
    assert reports_in(rt.outbox_path) == []
    assert len(lab_plant.events(kind="outcome", invocation_id=env.invocation_id)) == 1


def test_a_runtime_without_an_outbox_file_still_reports_every_outcome(
    lab_plant: Plant, lab: Lab, outbox_home: Path
) -> None:
    rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab, outbox=False)
    try:
        env = rt.invoke("orders.echo", {"n": 1}, actor=lab_plant.token())
        assert rt.flush(timeout_ms=10_000) == 0
    finally:
        rt.close()
    assert rt.outbox_path is None
    assert not (outbox_home / "warden").exists()
    assert len(lab_plant.events(kind="outcome", invocation_id=env.invocation_id)) == 1


def reports_in(outbox: Path) -> list[str]:
    conn = sqlite3.connect(outbox)
    try:
        return [row[0] for row in conn.execute("SELECT invocation_id FROM reports")]
    finally:
        conn.close()


# -- the plane killed under load from several client processes --------------------

CLIENTS = 3
CALLERS_PER_CLIENT = 24
DOWN_S = 2.0
CALLS_BEFORE_KILL = 150
CALLS_AFTER_RESTART = 150


@pytest.mark.heavy
def test_no_outcome_is_lost_when_the_plane_is_killed_under_load_and_restarted(
    tmp_path: Path,
) -> None:
    """Several client processes call through the SDK; the plane (all its
    processes) is killed with SIGKILL mid-load and restarted on the same port
    and store after two seconds. Every call whose caller saw ``succeeded`` has
    its outcome record, none has two, and the chain verifies."""
    config_file = write_plane_config(tmp_path)
    config = load_config(config_file, environ={})
    port = free_port()
    target = f"127.0.0.1:{port}"
    stop = tmp_path / "stop"
    outbox = tmp_path / "state" / "outbox-orders.sqlite"  # one file, shared by the clients
    actor = mint_token(config, subject="bot-7", ttl_seconds=3600)

    plane = start_plane_process(config_file, port)
    clients: list[subprocess.Popen[bytes]] = []
    try:
        wait_until_serving(target, plane)
        for number in range(CLIENTS):
            clients.append(
                start_client(
                    target,
                    outbox,
                    actor,
                    CALLERS_PER_CLIENT,
                    stop,
                    tmp_path / f"client-{number}.jsonl",
                )
            )
        await_records(config.store_path, "outcome", CALLS_BEFORE_KILL, clients)
        os.killpg(plane.pid, signal.SIGKILL)  # the first process and those that joined it
        plane.wait()
        time.sleep(DOWN_S)
        restarted_at = count_records(config.store_path, "decision")
        plane = start_plane_process(config_file, port)
        wait_until_serving(target, plane)
        await_records(config.store_path, "decision", restarted_at + CALLS_AFTER_RESTART, clients)
        stop.touch()
        for client in clients:
            assert client.wait(timeout=180) == 0, "a client could not drain its outbox"
    finally:
        stop.touch()
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.wait()
        if plane.poll() is None:
            plane.terminate()
            plane.wait(timeout=30)

    answers = [
        json.loads(line)
        for number in range(CLIENTS)
        for line in (tmp_path / f"client-{number}.jsonl").read_text().splitlines()
    ]
    succeeded = {invocation_id for invocation_id, status, _ in answers if status == "succeeded"}
    failures = Counter(code for _, status, code in answers if status != "succeeded")
    conn = sqlite3.connect(config.store_path)
    try:
        outcomes = Counter(
            row[0]
            for row in conn.execute("SELECT invocation_id FROM audit_events WHERE kind = 'outcome'")
        )
        (restart_seq,) = conn.execute(
            "SELECT max(seq) FROM audit_events WHERE kind = 'policy'"
        ).fetchone()
        carried = conn.execute(
            "SELECT count(*) FROM audit_events o JOIN audit_events d "
            "ON d.invocation_id = o.invocation_id AND d.kind = 'decision' "
            "WHERE o.kind = 'outcome' AND d.seq < ? AND o.seq > ?",
            (restart_seq, restart_seq),
        ).fetchone()[0]
    finally:
        conn.close()
    lost = succeeded - set(outcomes)
    duplicated = [i for i, n in outcomes.items() if n > 1]
    verified = subprocess.run(
        [*warden_command(), "audit", "verify", "--config", str(config_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    print(
        f"sent {len(answers)}, succeeded {len(succeeded)}, failed {dict(failures)}, "
        f"outcomes recorded "
        f"{sum(outcomes.values())}, of which reported across the restart {carried}; "
        f"lost {len(lost)}, duplicated {len(duplicated)}; "
        f"audit verify: {verified.stdout.strip()}"
    )
    assert lost == set()
    assert duplicated == []
    assert verified.returncode == 0 and "chain intact" in verified.stdout, verified
    assert carried > 0, "no call was in flight when the plane was killed"


def write_plane_config(folder: Path) -> Path:
    write_lab_policies(folder / "policies")
    config_file = folder / "warden.toml"
    config_file.write_text(
        f"""
[server]
store = "warden.db"
policies = "policies"
processes = {processes()}

[actors]
hs256_secret = "{ACTOR_SECRET}"
issuer = "warden-test"
audience = "warden"

[services.orders]
token = "{ORDERS_TOKEN}"
namespaces = ["orders"]
"""
    )
    return config_file


def count_records(store: Path, kind: str) -> int:
    conn = sqlite3.connect(store, timeout=30)
    try:
        row = conn.execute("SELECT count(*) FROM audit_events WHERE kind = ?", (kind,)).fetchone()
        return int(row[0])
    finally:
        conn.close()


def await_records(
    store: Path, kind: str, at_least: int, clients: list[subprocess.Popen[bytes]]
) -> None:
    """Wait until the log holds ``at_least`` records of ``kind`` (a minute at most)."""
    wait_for_count(lambda: count_records(store, kind), at_least, clients, f"{kind} records", 60)


def test_a_backlog_of_untaken_reports_holds_new_calls_back_and_fails_closed(
    lab_plant: Plant, lab: Lab, outbox_home: Path
) -> None:
    """A plane that takes outcome reports slower than calls end slows its
    callers: a call waits for room in the outbox before its Begin, and fails
    closed, its handler not run, when none comes in time."""
    actor = lab_plant.token()
    rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab, governance_timeout_ms=300)
    try:
        rt._outbox.backlog_limit = 0  # never room: every call is held back
        held = rt.invoke("orders.echo", {"n": 1}, actor=actor)
        assert held.status == "failed" and held.error is not None
        assert held.error.code == "GOVERNANCE_UNAVAILABLE" and held.error.retryable
        assert "outcome reports wait for the plane" in str(held.error.cause)
        assert lab.runs.get("orders.echo", 0) == 0
        assert lab_plant.events(invocation_id=held.invocation_id) == []
    finally:
        rt.close()

    # With the default timeout: each wait below lasts until the plane takes a
    # report, which a busy machine may stretch past a short budget.
    rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab)
    try:
        rt._outbox.backlog_limit = 1  # each call waits until the last report is taken
        calls = [rt.invoke("orders.echo", {"n": n}, actor=actor) for n in range(8)]
        assert [c.status for c in calls] == ["succeeded"] * 8
        assert rt.flush(timeout_ms=10_000) == 0
    finally:
        rt.close()
    seq = {
        (r["invocation_id"], r["kind"]): r["seq"]
        for r in lab_plant.events()
        if r["kind"] in ("decision", "outcome")
    }
    for before, after in itertools.pairwise(calls):
        assert seq[(before.invocation_id, "outcome")] < seq[(after.invocation_id, "decision")]
