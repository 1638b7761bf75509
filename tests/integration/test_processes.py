"""A plane of several processes (``[server] processes``) behaves as one."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks import free_port, process_tree, wait_until_serving, warden_command
from tests.conftest import (
    ACTOR_SECRET,
    EXAMPLE_POLICIES,
    ORDERS_TOKEN,
    Plant,
    copy_policies,
    make_config,
)
from warden.shared.wire import PROCESS_METADATA, SERVICE_TOKEN_METADATA
from warden.v1 import (
    approvals_pb2,
    approvals_pb2_grpc,
    governor_pb2,
    governor_pb2_grpc,
    policy_pb2,
    policy_pb2_grpc,
)
from warden_server import processes
from warden_server.app import SERVICE_NAMES, ServerLoop, _grpc_server, launch, serve
from warden_server.config import config_from_dict
from warden_server.plane import Plane
from warden_server.policy.loader import PolicyLoadError

pytestmark = pytest.mark.fixed_processes  # every test here says how many processes it runs

REVISION_WAIT_S = 10.0


def fresh_channel(target: str) -> grpc.Channel:
    """A channel with a connection of its own (not shared with other channels)."""
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def process_of(channel: grpc.Channel) -> str:
    """The process the channel's connection reached, as its Governor answers name it."""
    stub = governor_pb2_grpc.GovernorStub(channel)
    named = set()
    for _ in range(3):
        _, call = stub.CompleteMany.with_call(
            governor_pb2.CompleteManyRequest(),
            metadata=((SERVICE_TOKEN_METADATA, ORDERS_TOKEN),),
            timeout=5,
        )
        named |= {value for key, value in call.trailing_metadata() if key == PROCESS_METADATA}
    assert len(named) == 1, f"one connection was answered as {named}"
    return named.pop()


@contextmanager
def channel_to_each_process(target: str, processes: int) -> Iterator[dict[str, grpc.Channel]]:
    """A channel to each of the plane's processes, by the process's id: fresh
    connections until the kernel has put one on each."""
    found: dict[str, grpc.Channel] = {}
    try:
        for _ in range(40):
            channel = fresh_channel(target)
            process = process_of(channel)
            if process in found:
                channel.close()
                continue
            found[process] = channel
            if len(found) == processes:
                yield found
                return
        pytest.fail(f"the kernel spread 40 connections over {len(found)} processes")
    finally:
        for channel in found.values():
            channel.close()


def revisions(plant: Plant, channels: dict[str, grpc.Channel]) -> set[str]:
    """The policy revisions the processes serve, each asked on its own connection."""
    token = plant.token("pat", roles=("policy-author",))
    return {
        policy_pb2_grpc.PoliciesStub(channel)
        .GetStatus(policy_pb2.PolicyStatusRequest(actor_token=token), timeout=5)
        .current.revision
        for channel in channels.values()
    }


def test_every_process_hot_reloads_the_folder(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    folder = copy_policies(tmp_path / "policies")
    plant = start_plane(folder, processes=2, policy_debounce_ms=50)
    assert plant.server.joined is not None and len(plant.server.joined.pids) == 1
    with channel_to_each_process(plant.target, 2) as channels:
        before = revisions(plant, channels)
        assert len(before) == 1
        rules = folder / "orders.yaml"
        rules.write_text(rules.read_text() + "\n# an edit\n")
        deadline = time.monotonic() + REVISION_WAIT_S
        while (seen := revisions(plant, channels)) != {
            plant.server.plane.policies.current().revision
        } or (seen == before):
            assert time.monotonic() < deadline, f"processes still serve {seen}"
            time.sleep(0.1)
    loads = plant.events(kind="policy", status="loaded")
    assert [e["policy_revision"] for e in loads].count(seen.pop()) == 1, (
        "a revision is announced once, whichever process saw it first"
    )


def test_a_second_plane_cannot_share_the_port(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    plant = start_plane(processes=2)
    config = plant.config.model_copy(
        update={
            "server": plant.config.server.model_copy(
                update={"store": str(tmp_path / "other.db"), "policies": str(EXAMPLE_POLICIES)}
            )
        }
    )
    with pytest.raises(OSError, match="in use"):
        serve(Plane.from_config(config), plant.target)


def test_a_plane_told_to_stop_while_its_processes_start_stops_cleanly(tmp_path: Path) -> None:
    from tests.integration.test_cli import free_port, warden_command, write_config

    config_path = write_config(tmp_path / "cli")
    target = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [
            *warden_command(),
            "serve",
            "--config",
            str(config_path),
            "--listen",
            target,
            "--processes",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        # warden serve, the resource tracker, the forkserver, and the second process
        while len(process_tree(process.pid)) < 4:
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "no second process started"
            time.sleep(0.01)
        with socket.socket() as probe:  # nothing listens yet: every process is still loading
            assert probe.connect_ex(("127.0.0.1", int(target.rpartition(":")[2]))) != 0
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "received SIGTERM, stopping" in stderr


def test_a_plane_serves_on_every_process_from_its_first_connection(tmp_path: Path) -> None:
    """gRPC keeps a connection for good, and the kernel hands each to a process
    listening when it arrives: connections made as soon as the plane answers
    must reach every process, or their calls would stay on one for good."""
    from benchmarks import wait_until_serving
    from tests.integration.test_cli import (
        ORDERS_CLI_TOKEN,
        free_port,
        warden_command,
        write_config,
    )

    config_path = write_config(tmp_path / "cli")
    target = f"127.0.0.1:{free_port()}"
    serve_args = ["serve", "--config", str(config_path), "--listen", target, "--processes", "2"]
    process = subprocess.Popen(
        [*warden_command(), *serve_args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    channels = []
    try:
        wait_until_serving(target, process)  # a health check on a fresh connection
        options = [("grpc.use_local_subchannel_pool", 1)]
        channels = [grpc.insecure_channel(target, options=options) for _ in range(16)]
        for channel in channels:  # all of them connected now, before any is asked
            grpc.channel_ready_future(channel).result(timeout=10)
        reached = {_process_of(channel, ORDERS_CLI_TOKEN) for channel in channels}
    finally:
        for channel in channels:
            channel.close()
        stderr = _stopped(process)
    assert len(reached) == 2, f"16 connections all reached one process\n{stderr}"


def test_a_process_started_but_not_yet_serving_says_not_serving_for_every_service(
    tmp_path: Path,
) -> None:
    """The processes of a plane share its port and say SERVING one after the
    other (a joined one once it is ready, the first once all are). A health
    check that reaches one in between must hear NOT_SERVING, a status a probe
    waits out, not NOT_FOUND, which says the service does not exist."""
    plane = Plane.from_config(make_config(tmp_path, processes=1))
    loop = ServerLoop()
    server = None
    try:
        server, _ = loop.run(_grpc_server(plane, 1))
        port = server.add_insecure_port("127.0.0.1:0")
        loop.run(server.start())  # started, as serve() does before it says SERVING
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", *SERVICE_NAMES):
                answer = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
                assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING, name
    finally:
        if server is not None:
            loop.run(server.stop(0))
        plane.close()
        loop.close()


def _process_of(channel: grpc.Channel, token: str) -> str:
    """The process that answers on ``channel``'s connection."""
    _, call = governor_pb2_grpc.GovernorStub(channel).CompleteMany.with_call(
        governor_pb2.CompleteManyRequest(),
        metadata=((SERVICE_TOKEN_METADATA, token),),
        timeout=5,
    )
    (named,) = [value for key, value in call.trailing_metadata() if key == PROCESS_METADATA]
    return str(named)


def test_a_plane_whose_policy_set_is_broken_leaves_no_process_behind(tmp_path: Path) -> None:
    """The other processes start before the first has loaded its set; when it
    cannot, they stop with it."""
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "rules.yaml").write_text("rules:\n  - id: x\n    capabilities: [orders.get]\n")
    before = _grandchildren()
    with pytest.raises(PolicyLoadError, match="missing required key"):
        launch(make_config(tmp_path, folder, processes=2))
    deadline = time.monotonic() + 10
    while (left := _grandchildren() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, "a process that joined the plane outlived its failed start"


def test_a_start_that_fails_unexpectedly_after_the_others_listen_leaves_no_process_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure no one designed for (here, an error from the metrics
    endpoint that is no OSError) still stops the processes that joined. Left
    running, they would hold the first process at its exit, where
    multiprocessing waits for them while the failed start's objects (and the
    pipes they watch) are still held, as ``started`` holds them here."""
    from warden_server.processes import JoinedProcesses
    from warden_server.telemetry import Telemetry

    def broken(self: Telemetry, listen: str) -> int:
        raise RuntimeError("the metrics endpoint broke")

    started: list[JoinedProcesses] = []
    start = JoinedProcesses.start

    def kept(*args: Any, **kwargs: Any) -> JoinedProcesses:
        started.append(start(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(Telemetry, "serve_metrics", broken)
    monkeypatch.setattr(JoinedProcesses, "start", kept)
    config = make_config(tmp_path, processes=2)
    config = config.model_copy(
        update={"telemetry": config.telemetry.model_copy(update={"metrics_listen": "127.0.0.1:0"})}
    )
    before = _grandchildren()
    with pytest.raises(RuntimeError, match="the metrics endpoint broke"):
        launch(config)
    deadline = time.monotonic() + 10
    while (left := _grandchildren() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, "a process that joined the plane outlived its failed start"


def _grandchildren() -> set[int]:
    """The processes this one's children started: joining processes come from
    the forkserver, which this process started."""
    me = os.getpid()
    return {pid for pid in process_tree(me) if pid != me and _parent(pid) != me}


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])


def test_si4_processes_extend_one_chain_without_forks(
    start_plane: Callable[..., Plant], orders_example: Any
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from warden_server.audit.reader import verify

    plant = start_plane(processes=2)
    registry = plant.server.plane.telemetry.metrics.registry

    def begins_here() -> float:
        labels = {"method": "warden.v1.Governor/Begin", "code": "OK"}
        return registry.get_sample_value("warden_rpc_duration_seconds_count", labels) or 0.0

    def refund(rt: Any) -> str:
        # One agent per runtime: the example policies limit each agent's refunds.
        agent = plant.token(f"bot-{runtimes.index(rt)}")
        return str(
            rt.invoke("orders.refund", {"order_id": "A1", "amount": 120}, actor=agent).status
        )

    # Each runtime opens its own connection, and the kernel puts each on one of
    # the processes: open them until both processes serve some (the first
    # process counts only the calls it serves).
    runtimes: list[Any] = []
    served_by = set()
    try:
        while served_by != {"first", "other"}:
            assert len(runtimes) < 40, "the kernel never spread the connections"
            rt = orders_example.build_runtime(plant.target, ORDERS_TOKEN)
            runtimes.append(rt)
            rt.register()
            before = begins_here()
            assert refund(rt) == "succeeded"
            served_by.add("first" if begins_here() > before else "other")

        def calls(rt: Any) -> list[str]:
            return [refund(rt) for _ in range(15)]

        with ThreadPoolExecutor(len(runtimes)) as pool:
            statuses = [s for done in pool.map(calls, runtimes) for s in done]
    finally:
        for rt in runtimes:
            rt.close()
    total = 16 * len(runtimes)
    assert statuses == ["succeeded"] * 15 * len(runtimes)
    rows = plant.rows("SELECT seq, kind, status FROM audit_events ORDER BY seq")
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    outcomes = [r for r in rows if r["kind"] == "outcome" and r["status"] == "succeeded"]
    assert len(outcomes) == total
    result = verify(plant.server.plane.store)
    assert result.ok, result.problem


def test_a_plane_of_two_processes_prunes_on_schedule_once_while_both_serve(
    tmp_path: Path, orders_example: Any
) -> None:
    """Retention runs in the process that started the plane, however many
    joined it: the old records go under one signed checkpoint, later turns of
    the schedule find nothing more, and the chain verifies past the checkpoint
    with the records every process appended since."""
    from tests.integration import auditlog
    from tests.integration.test_audit_cli import ed25519_pem
    from warden_server.audit.reader import verify

    auditlog.seeded_store(tmp_path / "warden.db")  # months old by the time the plane starts
    base = make_config(tmp_path, processes=2).model_dump(mode="json", exclude={"base_dir"})
    base["audit"] = {
        "retention": "1d",
        "prune_interval": "1s",
        "checkpoint_key_file": str(ed25519_pem(tmp_path / "checkpoint.pem")),
    }
    server = launch(config_from_dict(base, base_dir=tmp_path))
    plant = Plant(server, tmp_path)
    runtimes: list[Any] = []

    def get(number: int) -> str:
        # One agent per runtime: the example policies limit each agent's calls.
        rt, agent = runtimes[number], plant.token(f"bot-{number}")
        return str(rt.invoke("orders.get", {"order_id": "A1"}, actor=agent).status)

    begins = "warden.v1.Governor/Begin"
    try:
        # Runtimes until the process that prunes and one that joined have both
        # answered calls (the first process counts only the calls it serves).
        served_by: set[str] = set()
        while served_by != {"first", "other"}:
            assert len(runtimes) < 40, "the kernel never spread the connections"
            runtimes.append(orders_example.build_runtime(plant.target, ORDERS_TOKEN))
            runtimes[-1].register()
            before = plant.rpc_calls(begins)
            assert get(len(runtimes) - 1) == "succeeded"
            served_by.add("first" if plant.rpc_calls(begins) > before else "other")
        # Calls from every runtime across three turns of the schedule.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert {get(number) for number in range(len(runtimes))} == {"succeeded"}
        for rt in runtimes:
            rt.close()
        runtimes.clear()
        rows = plant.rows()
        store = server.plane.store
        checkpoint = store.audit_checkpoint()
        assert checkpoint is not None and checkpoint.seq == len(auditlog.LOG)
        assert rows[0]["seq"] == len(auditlog.LOG) + 1, "the old records are gone, no others"
        pruned = [r for r in rows if r["kind"] == "retention"]
        assert [r["status"] for r in pruned] == ["pruned"], "pruned once, by one process"
        assert sum(r["kind"] == "outcome" for r in rows) >= len(served_by)
        result = verify(store, server.plane.checkpoints)
        assert result.ok, result.problem
    finally:
        for rt in runtimes:
            rt.close()
        server.stop(grace=0)


def answering_process(target: str) -> str:
    """The process a fresh connection reached."""
    with fresh_channel(target) as channel:
        return process_of(channel)


def processes_answering(target: str, expected: int) -> set[str]:
    """The processes fresh connections reach, until ``expected`` of them have
    answered or 40 connections were made."""
    seen: set[str] = set()
    for _ in range(40):
        seen.add(answering_process(target))
        if len(seen) == expected:
            break
    return seen


def test_each_process_names_itself_in_governor_answers(
    start_plane: Callable[..., Plant], orders_example: Any
) -> None:
    """The SDK balances its calls by process: every process answers with an id
    of its own, the same on every call of a connection."""
    plant = start_plane(processes=2)
    seen = processes_answering(plant.target, 2)
    assert len(seen) == 2, "the kernel never spread the connections"
    assert plant.server.plane.process_id in seen

    rt = orders_example.build_runtime(plant.target, ORDERS_TOKEN)
    try:
        rt.register()
        for _ in range(8):
            rt.invoke("orders.get", {"order_id": "A1"}, actor=plant.token("bot-1"))
        # invoke from a thread takes the blocking connections; the loop's are there too.
        pools = [*rt._transport._pools.values(), rt._transport._blocking]
        learned = {c.process for pool in pools if pool for c in pool.connections if c.process}
    finally:
        rt.close()
    assert learned and learned <= seen, f"the runtime's connections learned {learned}"


def test_a_watcher_on_one_process_hears_approvals_decided_on_another(
    start_plane: Callable[..., Plant], orders_example: Any
) -> None:
    """Approvals' watch streams with several processes: a watcher hears every
    process's transitions, not only those of the process it is connected to."""
    plant = start_plane(processes=2)
    rt = orders_example.build_runtime(plant.target, ORDERS_TOKEN)
    with channel_to_each_process(plant.target, 2) as channels, contextlib.closing(rt):
        rt.register()
        watching, deciding = channels.values()
        governor = governor_pb2_grpc.GovernorStub(deciding)
        approvals = approvals_pb2_grpc.ApprovalsStub(deciding)
        manager = (("authorization", f"Bearer {plant.token('mia', roles=('manager',))}"),)

        def suspended() -> str:
            answer = governor.Begin(
                governor_pb2.BeginRequest(
                    invocation_id=str(uuid.uuid4()),
                    capability_id="orders.refund",
                    actor_token=plant.token("bot-7"),
                    input_json='{"order_id": "A1", "amount": 730}',
                ),
                metadata=((SERVICE_TOKEN_METADATA, ORDERS_TOKEN),),
                timeout=10,
            )
            assert answer.WhichOneof("outcome") == "suspension", answer
            return answer.suspension.approval_id

        waiting = suspended()
        # Subscribed once the pending approval has come: what happens next is heard.
        events = approvals_pb2_grpc.ApprovalsStub(watching).Watch(
            approvals_pb2.WatchApprovalsRequest(include_pending=True), metadata=manager, timeout=30
        )
        heard = [next(events)]
        approvals.Approve(approvals_pb2.ApproveRequest(id=waiting), metadata=manager, timeout=10)
        heard.append(next(events))
        requested = suspended()
        heard.append(next(events))
        events.cancel()
        kinds = approvals_pb2.ApprovalEventType
        assert [(kinds.Name(e.type), e.approval.id) for e in heard] == [
            ("APPROVAL_EVENT_TYPE_PENDING", waiting),
            ("APPROVAL_EVENT_TYPE_APPROVED", waiting),
            ("APPROVAL_EVENT_TYPE_REQUESTED", requested),
        ]
        assert heard[1].approval.decided_by == "mia"


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "sentinel"])
def test_a_process_that_ends_while_serving_is_replaced(
    start_plane: Callable[..., Plant],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    pidfds: bool,
) -> None:
    """A process killed while the plane serves (by the kernel, for memory,
    say) is logged and replaced, and the new one serves beside the first;
    also where the system has no pidfds, and only the forkserver says."""
    if not pidfds:
        monkeypatch.setattr(processes, "_pidfd", lambda process: None)
    plant = start_plane(processes=2)
    joined = plant.server.joined
    assert joined is not None
    (killed,) = joined.pids
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while joined.replaced == 0:
        assert time.monotonic() < deadline, "the process was not replaced"
        time.sleep(0.05)
    (started,) = joined.pids
    assert started != killed
    assert len(processes_answering(plant.target, 2)) == 2, "only one process answers"
    assert f"(pid {killed}) ended with status -9" in caplog.text
    metrics = plant.server.plane.telemetry.metrics.registry
    assert metrics.get_sample_value("warden_processes_replaced_total") == 1


def test_a_process_outlives_its_forkserver_and_is_not_replaced(
    start_plane: Callable[..., Plant], caplog: pytest.LogCaptureFixture
) -> None:
    """The joining processes are forked from multiprocessing's forkserver,
    whose pipe reads as if each of them had ended when only the forkserver
    did (killed here; a service manager signalling the whole process group
    does the same). They go on serving: none is replaced, no error is logged,
    and the plane still stops them."""
    plant = start_plane(processes=2)
    joined = plant.server.joined
    assert joined is not None
    (serving,) = joined.pids
    forkserver = _parent(serving)
    assert forkserver is not None and forkserver != os.getpid()
    os.kill(forkserver, signal.SIGKILL)
    deadline = time.monotonic() + 3  # a replacement is logged at once, started within 1 s
    while time.monotonic() < deadline:
        assert "ended with status" not in caplog.text, "a live process was taken for ended"
        time.sleep(0.05)
    assert joined.replaced == 0
    assert joined.pids == [serving]
    assert len(processes_answering(plant.target, 2)) == 2, "only one process answers"
    plant.server.stop(grace=0)
    assert _ends_within(serving, 15), "the plane's stop did not reach the process"


def test_a_process_ended_just_before_the_plane_stops_is_not_taken_for_a_failure(
    start_plane: Callable[..., Plant], caplog: pytest.LogCaptureFixture
) -> None:
    """A SIGTERM to the whole process group may end a joining process before
    the first process's handler has asked the plane to stop: that process is
    neither logged as ended with an error nor replaced (nor is a replacement
    started through a forkserver the same signal ended)."""
    plant = start_plane(processes=2)
    joined = plant.server.joined
    assert joined is not None
    (serving,) = joined.pids
    os.kill(serving, signal.SIGTERM)
    assert _ends_within(serving, 15), "the process did not stop on SIGTERM"
    plant.server.stop(grace=0)
    assert "ended with status" not in caplog.text
    assert joined.replaced == 0


def test_a_plane_signalled_as_a_process_group_stops_cleanly(tmp_path: Path) -> None:
    """``systemctl stop`` (KillMode=control-group) sends SIGTERM to every
    process of the plane at once, the forkserver among them: the plane exits
    with status 0 and logs no error."""
    config = tmp_path / "warden.toml"
    (tmp_path / "policies").mkdir()
    config.write_text(
        '[server]\nstore = "warden.db"\npolicies = "policies"\nprocesses = 2\n'
        f'[actors]\nhs256_secret = "{ACTOR_SECRET}"\n'
        f'[services.orders]\ntoken = "{ORDERS_TOKEN}"\nnamespaces = ["orders"]\n'
    )
    port = free_port()
    plane = subprocess.Popen(
        [*warden_command(), "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_until_serving(f"127.0.0.1:{port}", plane)
        assert len(processes_answering(f"127.0.0.1:{port}", 2)) == 2
        os.killpg(plane.pid, signal.SIGTERM)
        _, stderr = plane.communicate(timeout=30)
    finally:
        if plane.poll() is None:
            os.killpg(plane.pid, signal.SIGKILL)
            plane.wait()
    said = stderr.decode()
    assert plane.returncode == 0, said
    assert " ERROR " not in said, said
    assert "stopping" in said


def _ends_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if _state(pid) == "Z":  # ended; its new parent has yet to reap it
            return True
        time.sleep(0.05)
    return False


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None


def test_metrics_count_the_calls_every_process_served(tmp_path: Path, orders_example: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.conftest import make_config

    config = make_config(tmp_path, processes=2)
    config = config.model_copy(
        update={"telemetry": config.telemetry.model_copy(update={"metrics_listen": "127.0.0.1:0"})}
    )
    server = serve(Plane.from_config(config), "127.0.0.1:0")
    plant = Plant(server, tmp_path)
    own = server.plane.telemetry.metrics.registry
    granted = {"stage": "none", "code": "none", "status": "granted"}

    def counted_here() -> float:
        return own.get_sample_value("warden_decisions_total", granted) or 0.0

    runtimes: list[Any] = []
    calls = 0
    try:
        # Until some calls were served by the other process (the kernel
        # spreads connections), call through more runtimes.
        while counted_here() == calls:
            assert len(runtimes) < 20, "the kernel never spread the connections"
            rt = orders_example.build_runtime(plant.target, ORDERS_TOKEN)
            runtimes.append(rt)
            rt.register()
            for _ in range(8):
                env = rt.invoke("orders.get", {"order_id": "A1"}, actor=plant.token())
                assert env.status == "succeeded"
                calls += 1
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as page:
            text = page.read().decode()
    finally:
        for rt in runtimes:
            rt.close()
        server.stop(grace=0)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("warden_decisions_total", tuple(sorted(granted.items())))] == calls
    assert counted_here() < calls


def _stopped(process: subprocess.Popen[str]) -> str:
    """Stop ``warden serve`` with SIGTERM and return what it wrote on stderr.
    One that has not ended 30 s later is killed, not left behind hung, and
    the test fails."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate(timeout=10)
        raise


def _serving_processes(first: int) -> list[int]:
    """``warden serve``'s own pid and its joined processes': the descendants
    that run threads (the forkserver and its resource tracker run one each)."""
    return [first] + [
        pid for pid in process_tree(first)[1:] if len(list(Path(f"/proc/{pid}/task").iterdir())) > 1
    ]


def _thread_cpus(pid: int) -> set[frozenset[int]]:
    """The CPU sets the threads of ``pid`` may run on, each set once."""
    return {
        frozenset(os.sched_getaffinity(int(t.name))) for t in Path(f"/proc/{pid}/task").iterdir()
    }


@pytest.mark.parametrize("pin", [True, False])
def test_with_one_process_per_cpu_each_runs_on_a_cpu_of_its_own(tmp_path: Path, pin: bool) -> None:
    from tests.integration.test_cli import free_port, warden_command, write_config

    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        pytest.skip("needs two CPUs to place two processes on")
    cpus = usable[:2]
    config_path = write_config(tmp_path / "cli")
    text = config_path.read_text()
    config_path.write_text(
        text.replace("[server]\n", f"[server]\npin_processes = {str(pin).lower()}\n", 1)
    )
    target = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        # Two CPUs given to two processes: one process per CPU, the default count.
        ["taskset", "-c", ",".join(map(str, cpus)), *warden_command(), "serve",
         "--config", str(config_path), "--listen", target, "--metrics-listen", "off"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        started = process.stderr.readline()
        while "warden serving on" not in started:
            assert started, "warden serve ended before it served"
            started = process.stderr.readline()
        serving = _serving_processes(process.pid)
        assert len(serving) == 2, f"expected the first process and one joined, got {serving}"
        placed = [_thread_cpus(pid) for pid in serving]
    finally:
        _stopped(process)
    assert "2 processes" in started, started
    if pin:
        assert placed == [{frozenset({cpus[0]})}, {frozenset({cpus[1]})}], placed
        assert f"on CPUs {cpus[0]}, {cpus[1]}" in started
    else:
        assert placed == [{frozenset(cpus)}, {frozenset(cpus)}], placed
        assert "on CPUs" not in started


def test_metrics_show_the_revision_every_process_serves_after_a_reload(tmp_path: Path) -> None:
    """Each process reports the revision it serves, read when scraped: the
    plane's figure shows the old revision no more once all have reloaded (it
    was set by whichever process recorded the load, and the others kept
    theirs)."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.conftest import make_config

    folder = copy_policies(tmp_path / "policies")
    config = make_config(tmp_path, folder, processes=2, policy_debounce_ms=50)
    config = config.model_copy(
        update={"telemetry": config.telemetry.model_copy(update={"metrics_listen": "127.0.0.1:0"})}
    )
    server = serve(Plane.from_config(config), "127.0.0.1:0")
    plant = Plant(server, tmp_path)

    def shown() -> dict[str, float]:
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        with urllib.request.urlopen(url) as page:
            text = page.read().decode()
        return {
            s.labels["revision"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "warden_policy_revision_info"
        }

    try:
        first = server.plane.policies.current().revision
        assert shown() == {first: 1}
        with channel_to_each_process(plant.target, 2) as channels:
            rules = folder / "orders.yaml"
            rules.write_text(rules.read_text() + "\n# an edit\n")
            deadline = time.monotonic() + REVISION_WAIT_S
            while (seen := revisions(plant, channels)) == {first} or len(seen) > 1:
                assert time.monotonic() < deadline, f"processes still serve {seen}"
                time.sleep(0.1)
        assert shown() == {seen.pop(): 1}
    finally:
        server.stop(grace=0)
