"""The ``warden`` command line: in-process through click's CliRunner, and as
real processes for ``serve``."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import http.server
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import grpc
import jwt
import pytest
from click.testing import CliRunner, Result
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

import warden
from benchmarks import free_port, process_tree, wait_until_serving
from tests.conftest import ACTOR_SECRET, EXAMPLE_POLICIES, Plant
from warden_server import cli
from warden_server.auth.actors import ActorVerifier
from warden_server.cli import main
from warden_server.config import load_config
from warden_server.grants import default_key_path

ORDERS_CLI_TOKEN = "cli-test-orders-token"
BROKEN_POLICY = """\
rules:
  - id: fine
    capabilities: ["orders.*"]
    effect: allow
  - id: broken
    capabilities: ["orders.*"]
    effect: deny
    when: actor.roles +
"""


def line_starting(lines: list[str], key: str) -> int:
    """The number of the first of ``lines`` that starts with ``key``."""
    return next(n for n, line in enumerate(lines, 1) if line.startswith(key))


def refused_at_start(config_path: Path) -> tuple[list[str], Callable[[str], int]]:
    """``warden serve`` with ``config_path``, which must refuse to start: the
    lines it said, and the line of the config each setting is on."""
    lines = config_path.read_text().splitlines()
    done = warden_exits("serve", "--config", str(config_path))
    assert done.returncode == 1, done.stderr
    return done.stderr.splitlines(), lambda key: line_starting(lines, key)


def warden_exits(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``warden ARGS`` in a process of its own, run until it exits (a command
    that fails before it serves, or one that ends by itself)."""
    return subprocess.run(
        [*warden_command(), *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


def write_config(
    folder: Path,
    *,
    policies: Path = EXAMPLE_POLICIES,
    actors: str = f'hs256_secret = "{ACTOR_SECRET}"',
) -> Path:
    """A warden.toml in ``folder``: its own store, the given policies and actor keys."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "warden.toml"
    path.write_text(
        f"""\
[server]
listen = "127.0.0.1:0"
store = "var/warden.db"
policies = {json.dumps(str(policies))}

[actors]
{actors}
issuer = "warden-test"
audience = "warden"

[services.orders]
token = "{ORDERS_CLI_TOKEN}"
namespaces = ["orders"]
"""
    )
    return path


def run(*args: str) -> Result:
    """Invoke the CLI in-process with a clean environment for its secrets."""
    runner = CliRunner(env={"WARDEN_ACTORS_HS256_SECRET": None})
    return runner.invoke(main, list(args), catch_exceptions=False)


def warden_command() -> list[str]:
    """The CLI as a real process (``python -m warden_server.cli`` runs ``main``)."""
    return [sys.executable, "-m", "warden_server.cli"]


# -- token mint ----------------------------------------------------------------------


def test_token_mint_prints_a_jwt_the_plane_accepts(
    tmp_path: Path, lab_plant: Plant, lab_rt: warden.Runtime
) -> None:
    config_path = write_config(tmp_path / "cli")
    result = run(
        "token", "mint", "--config", str(config_path),
        "--sub", "alice", "--role", "support", "--tenant", "acme",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    assert token.count(".") == 2 and "\n" not in token

    actor = ActorVerifier.from_config(load_config(config_path)).verify(token)
    assert (actor.id, actor.roles, actor.tenant) == ("alice", ("support",), "acme")

    # A running plane with the same actor settings governs a call made with it.
    env = lab_rt.invoke("orders.echo", {"n": 1}, actor=token)
    assert env.status == "succeeded"
    (decision,) = lab_plant.events(invocation_id=env.invocation_id, kind="decision")
    assert (decision["status"], decision["actor_id"], decision["tenant"]) == (
        "granted",
        "alice",
        "acme",
    )


@pytest.mark.fixed_processes
def test_token_mint_carries_several_roles_attributes_and_the_ttl(tmp_path: Path) -> None:
    config_path = write_config(tmp_path / "cli")
    result = run(
        "token", "mint", "--config", str(config_path), "--sub", "maria",
        "--role", "manager", "--role", "auditor", "--attr", "desk=emea", "--ttl", "120",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    actor = ActorVerifier.from_config(load_config(config_path)).verify(token)
    assert actor.roles == ("manager", "auditor")
    assert actor.tenant == ""
    assert actor.attrs["desk"] == "emea"
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 120
    assert (claims["iss"], claims["aud"]) == ("warden-test", "warden")


@pytest.mark.fixed_processes
def test_token_mint_refuses_a_malformed_attribute(tmp_path: Path) -> None:
    config_path = write_config(tmp_path / "cli")
    result = run("token", "mint", "--config", str(config_path), "--sub", "a", "--attr", "desk")
    assert result.exit_code == 2
    assert "'desk' is not KEY=VALUE" in result.stderr


@pytest.mark.fixed_processes
@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (("--sub", "a", "--ttl", "0"), "'--ttl': 0 is not in the range x>=1"),
        (("--sub", " "), "the actor id must not be empty"),
        (("--sub", "a", "--attr", "exp=1"), "'exp' is a claim the token sets itself"),
        (("--sub", "a", "--attr", "sub=root"), "'sub' is a claim the token sets itself"),
    ],
)
def test_token_mint_refuses_what_would_make_a_broken_token(
    tmp_path: Path, arguments: tuple[str, ...], said: str
) -> None:
    config_path = write_config(tmp_path / "cli")
    result = run("token", "mint", "--config", str(config_path), *arguments)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert said in result.stderr


def test_help_answers_to_h_as_well() -> None:
    for command in ([], ["policy", "check"], ["audit", "verify"]):
        result = CliRunner().invoke(main, [*command, "-h"], prog_name="warden")
        assert result.exit_code == 0 and result.output.startswith("Usage: warden"), command


@pytest.mark.parametrize(
    "command",
    [["policy", "check", str(EXAMPLE_POLICIES)], ["policy", "status"], ["limits", "status"]],
)
def test_a_target_without_a_token_is_the_same_usage_error_everywhere(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WARDEN_TOKEN", raising=False)
    result = CliRunner().invoke(main, [*command, "--target", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert "no token: give a JWT with --token, or set WARDEN_TOKEN" in result.output


def test_a_target_with_a_scheme_is_a_usage_error() -> None:
    result = CliRunner().invoke(
        main, ["approvals", "list", "--target", "http://127.0.0.1:50051", "--token", "t"]
    )
    assert result.exit_code == 2
    assert "'http://127.0.0.1:50051' is not HOST:PORT: give the address without a scheme" in (
        result.output
    )


@pytest.mark.fixed_processes
def test_token_mint_without_an_hs256_secret_is_a_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "cli"
    config_path = write_config(folder, actors='public_key_file = "actors.pem"')
    result = run("token", "mint", "--config", str(config_path), "--sub", "alice")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "token mint needs [actors] hs256_secret" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.fixed_processes
def test_token_mint_with_no_actor_keys_at_all_names_the_missing_setting(tmp_path: Path) -> None:
    config_path = write_config(tmp_path / "cli", actors="")
    result = run("token", "mint", "--config", str(config_path), "--sub", "alice")
    assert result.exit_code == 1
    assert "set exactly one of hs256_secret, public_key_file or jwks_file" in result.stderr


@pytest.mark.fixed_processes
def test_token_mint_with_a_missing_config_file_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    result = run("token", "mint", "--config", str(missing), "--sub", "alice")
    assert result.exit_code == 1
    assert f"{missing}: no such config file" in result.stderr


# -- serve (real processes) ------------------------------------------------------------


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes started by a test; any still running at teardown is killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)


def start_serve(
    processes: list[subprocess.Popen[str]],
    config_path: Path,
    target: str,
    *args: str,
    stdout: int = subprocess.PIPE,
) -> subprocess.Popen[str]:
    """``warden serve`` on ``target`` as a real process, its stderr piped (the
    ``processes`` fixture kills it if the test leaves it running)."""
    process = subprocess.Popen(
        [*warden_command(), "serve", "--config", str(config_path), "--listen", target, *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )
    processes.append(process)
    return process


def await_serving(process: subprocess.Popen[str], target: str) -> None:
    """Wait for ``warden serve`` to answer SERVING on ``target``; fail the test
    with what it said on stderr if it never does."""
    try:
        wait_until_serving(target, process, seconds=30)
    except (RuntimeError, grpc.RpcError):
        process.kill()
        _, stderr = process.communicate(timeout=10)
        pytest.fail(f"warden serve never served on {target}:\n{stderr}")


@pytest.mark.fixed_processes
def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run(
        [*warden_command(), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout and "serve" in done.stdout


def run_python(snippet: str, *args: str) -> str:
    """What ``snippet`` prints, run in a fresh interpreter (what it imports is its own)."""
    done = subprocess.run(
        [sys.executable, "-c", snippet, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


CHECK_HELP_IMPORTS = """
import sys
from click.testing import CliRunner
from warden_server.cli import main
result = CliRunner().invoke(main, ["--help"])
assert result.exit_code == 0, result.output
print(result.output)
print(" ".join(sorted(sys.modules)))
"""


@pytest.mark.fixed_processes
def test_warden_help_lists_every_command_with_its_summary_and_imports_none() -> None:
    *shown, modules = run_python(CHECK_HELP_IMPORTS).strip().split("\n")
    listed = " ".join(" ".join(shown).split())
    for name, entry in cli.COMMANDS.items():
        assert f"{name} {entry.summary}" in listed
    assert not {f"warden_server.cli.{name}" for name in cli.COMMANDS} & set(modules.split())


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_a_command_summary_is_the_first_sentence_of_its_own_help(name: str) -> None:
    command = main.get_command(click.Context(main), name)
    assert command is not None and command.help
    first_paragraph = " ".join(command.help.split("\n\n")[0].split())
    assert first_paragraph.startswith(cli.COMMANDS[name].summary)


CHECK_IMPORTS = """
import sys
from click.testing import CliRunner
from warden_server.cli import main
result = CliRunner().invoke(main, sys.argv[1:])
assert result.exit_code == 0, result.output
print(" ".join(sorted(sys.modules)))
"""


def modules_loaded_by(*args: str) -> set[str]:
    """The modules a fresh interpreter has loaded once ``warden ARGS`` ran."""
    return set(run_python(CHECK_IMPORTS, *args).split())


@pytest.mark.fixed_processes
def test_a_command_imports_its_own_module_and_not_the_plane() -> None:
    """A command's module is imported when it runs (warden_server.cli.COMMANDS):
    `warden token` does not pay for importing the plane, gRPC or the stores."""
    loaded = modules_loaded_by("token", "mint", "--help")
    assert "warden_server.cli.token" in loaded
    assert not loaded & {
        "warden_server.cli.serve",
        "warden_server.cli.audit",
        "warden_server.app",
        "warden_server.plane",
        "warden_server.store",
        "grpc",
    }


@pytest.mark.fixed_processes
def test_audit_commands_do_not_import_the_plane() -> None:
    """`warden audit` reads and converts records: it does not pay for importing
    the plane's pipeline, policy loader and type checker."""
    loaded = modules_loaded_by("audit", "verify", "--help")
    assert "warden_server.cli.audit" in loaded
    assert not loaded & {
        "warden_server.app",
        "warden_server.plane",
        "warden_server.pipeline",
        "warden_server.policy.loader",
        "warden_server.policy.typecheck",
    }


CHECK_GRAMMAR = """
import celpy.celparser
import warden_server.policy.coverage
import warden_server.policy.definitions
import warden_server.policy.typecheck
print(celpy.celparser.CELParser.CEL_PARSER is not None)
"""


@pytest.mark.fixed_processes
def test_importing_the_policy_modules_does_not_build_the_cel_grammar() -> None:
    """cel-python's grammar (about 0.3 s to build) is built when a condition is
    first parsed, not by importing a module that may parse one."""
    assert run_python(CHECK_GRAMMAR).strip() == "False"


@pytest.mark.fixed_processes
def test_serve_is_healthy_reflects_its_services_and_stops_cleanly_on_sigterm(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    config_path = write_config(tmp_path / "cli")
    target = f"127.0.0.1:{free_port()}"
    process = start_serve(processes, config_path, target)
    channel = grpc.insecure_channel(target)
    try:
        await_serving(process, target)
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "warden.v1.Governor", "warden.v1.Registry"):
            # This connection may reach the other process, which may say
            # SERVING a moment later than the one the wait above reached.
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            deadline = time.monotonic() + 10
            while answer.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                assert time.monotonic() < deadline, f"{service} never said SERVING"
                time.sleep(0.01)
                answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service

        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
        )
        names = {s.name for r in responses for s in r.list_services_response.service}
        assert {"warden.v1.Governor", "warden.v1.Registry", "grpc.health.v1.Health"} <= names
    finally:
        channel.close()

    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0, stderr
    assert f"warden serving on {target}" in stderr
    assert "received SIGTERM, stopping" in stderr
    assert (tmp_path / "cli" / "var" / "warden.db").exists()


@pytest.mark.fixed_processes
def test_serve_with_json_logs_says_every_line_of_its_own_as_json(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    config_path = write_config(tmp_path / "cli")
    target = f"127.0.0.1:{free_port()}"
    process = start_serve(
        processes, config_path, target, "--log-format", "json", "--processes", "2"
    )
    await_serving(process, target)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0, stderr
    said = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    messages = [entry["message"] for entry in said]
    assert any(m.startswith(f"warden serving on {target} (store ") for m in messages), messages
    assert sum(m.startswith(f"warden listening on {target}") for m in messages) == 2, messages
    assert "received SIGTERM, stopping" in messages


def test_serve_stops_on_a_sigterm_the_kernel_hands_to_another_of_its_threads(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """The kernel may give a process's SIGTERM to any of its threads; Python
    runs the handler on the main thread, which must not be blocked for good
    meanwhile (a plane once served on, deaf to the SIGTERM of a test)."""
    config_path = write_config(tmp_path / "cli")
    target = f"127.0.0.1:{free_port()}"
    process = start_serve(processes, config_path, target)
    await_serving(process, target)
    threads = sorted(int(t) for t in os.listdir(f"/proc/{process.pid}/task"))
    other = threads[-1]
    assert other != process.pid, "the plane runs more threads than its main one"
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.tgkill(process.pid, other, signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())

    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    assert "received SIGTERM, stopping" in stderr


def test_a_stop_signal_is_answered_on_the_main_thread_even_while_the_loop_is_busy(
    tmp_path: Path,
) -> None:
    """The handler of a stopping signal only records it, and the main
    thread's wait returns to stop the plane. A handler that stopped the plane
    itself waited for the event loop, and the loop could be waiting for a lock
    the main thread held where the signal interrupted it: ``warden serve``
    once hung for good on a SIGTERM that way. Here the loop is held busy when
    the signal comes; the wait must return before the loop is let go."""
    from tests.conftest import make_config
    from warden_server.app import launch
    from warden_server.stopping import StopRequest

    server = launch(make_config(tmp_path))
    busy, let_go = threading.Event(), threading.Event()

    async def hold_the_loop() -> None:
        busy.set()
        let_go.wait(timeout=20)  # blocks the loop's thread, as a lock would

    request = StopRequest()
    kept = signal.signal(signal.SIGUSR1, request.handle)  # as `warden serve` sets SIGTERM's
    try:
        held = asyncio.run_coroutine_threadsafe(hold_the_loop(), server.loop.loop)
        assert busy.wait(timeout=10)
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        # Should the wait not answer, the loop is let go and the plane
        # stopped from here after a while, so that the test fails, not hangs.
        fallback = threading.Timer(15, lambda: (let_go.set(), server.stop(grace=0)))
        fallback.start()
        server.wait(until=request.made)
        answered_while_busy = not let_go.is_set()
        fallback.cancel()
    finally:
        signal.signal(signal.SIGUSR1, kept)
        let_go.set()
    held.result(timeout=10)
    server.stop(grace=0)
    assert answered_while_busy, "the wait returned only once the loop was free"
    assert request.reason == "received SIGUSR1"


def test_a_wait_returns_once_another_threads_stop_is_done_though_the_loop_never_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop from another thread closes the loop that would answer the
    wait; should the loop close before it answers (a stop that ends between
    the wait's start and its first turn), the wait must still return once
    the stop is done, not look for good at a future nothing will settle."""
    from tests.conftest import make_config
    from warden_server.app import launch

    server = launch(make_config(tmp_path))
    asked = threading.Event()

    async def never_answered() -> None:
        asked.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(server.grpc_server, "wait_for_termination", never_answered)

    def stop_once_waited_for() -> None:
        asked.wait(timeout=10)
        server.stop(grace=0)

    stopper = threading.Thread(target=stop_once_waited_for, daemon=True)
    waiter = threading.Thread(target=server.wait, daemon=True)
    stopper.start()
    waiter.start()
    stopper.join(timeout=20)
    waiter.join(timeout=10)
    assert asked.is_set(), "the wait asked the loop for the server's end"
    assert not stopper.is_alive(), "the stop ended"
    assert not waiter.is_alive(), "the wait went on after the stop had ended"


@pytest.mark.heavy
@pytest.mark.fixed_processes
def test_serve_collects_young_garbage_rarely_so_calls_in_flight_do_not_age_into_full_collections(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """Every gRPC call leaves a reference cycle (grpc.aio's handler lookup)
    that only the collector frees. At CPython's threshold of 700 allocations
    a young collection ran every few calls, and what the calls in flight
    held aged towards full collections (``processes.prepare_collector``)."""
    config_path = write_config(tmp_path / "cli")
    metrics = f"127.0.0.1:{free_port()}"
    text = config_path.read_text()
    config_path.write_text(f'{text}\n[telemetry]\nmetrics_listen = "{metrics}"\n')
    target = f"127.0.0.1:{free_port()}"
    process = start_serve(processes, config_path, target, "--processes", "1")
    await_serving(process, target)

    def young_collections() -> float:
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as page:
            for family in text_string_to_metric_families(page.read().decode()):
                for sample in family.samples:
                    if sample.name == "python_gc_collections_total" and sample.labels == {
                        "generation": "0"
                    }:
                        return sample.value
        raise AssertionError("/metrics has no python_gc_collections_total for generation 0")

    calls = 4_000
    with grpc.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        check = health_pb2.HealthCheckRequest(service="")
        before = young_collections()
        for _ in range(calls):
            health.Check(check, timeout=10)
        after = young_collections()
    # About five objects in a cycle a call: 20,000 allocations, two young
    # collections at the serving threshold (10,000), some 30 at CPython's 700.
    assert after - before <= 6, f"{after - before:.0f} young collections in {calls} calls"


@pytest.mark.fixed_processes
def test_serve_with_a_broken_policy_folder_exits_non_zero_naming_file_line_col(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "broken-policies"
    broken.mkdir()
    (broken / "rules.yaml").write_text(BROKEN_POLICY)
    config_path = write_config(tmp_path / "cli", policies=broken)
    done = warden_exits("serve", "--config", str(config_path), "--listen", "127.0.0.1:0")
    assert done.returncode != 0
    assert "the policy set has problems" in done.stderr
    assert f"{broken / 'rules.yaml'}:8:" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.fixed_processes
def test_serve_policies_flag_overrides_the_config(tmp_path: Path) -> None:
    """--policies wins over [server] policies: a good config pointed at a broken folder fails."""
    broken = tmp_path / "broken-policies"
    broken.mkdir()
    (broken / "rules.yaml").write_text(BROKEN_POLICY)
    config_path = write_config(tmp_path / "cli")
    done = warden_exits("serve", "--config", str(config_path), "--policies", str(broken))
    assert done.returncode != 0
    assert f"{broken / 'rules.yaml'}:8:" in done.stderr, done.stderr


CHECK_SERVE_IMPORTS = """
import socket, sys
from click.testing import CliRunner
from warden_server.cli import main
with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    address = "127.0.0.1:%d" % taken.getsockname()[1]
    result = CliRunner().invoke(main, ["serve", "--config", sys.argv[1], "--listen", address])
print(result.exit_code, result.output.strip().splitlines()[-1])
print(" ".join(sorted(sys.modules)))
"""


@pytest.mark.fixed_processes
def test_serve_on_a_taken_address_fails_before_importing_or_starting_the_plane(
    tmp_path: Path,
) -> None:
    config_path = write_config(tmp_path / "cli")
    said, modules = run_python(CHECK_SERVE_IMPORTS, str(config_path)).strip().split("\n")
    assert said.startswith("1 Error: cannot listen on 127.0.0.1:"), said
    assert not {"warden_server.app", "warden_server.plane", "multiprocessing.forkserver"} & set(
        modules.split()
    )
    assert not (config_path.parent / "var").exists(), "it wrote key files before failing"


def test_serve_on_an_address_another_plane_holds_fails_instead_of_sharing_it(
    tmp_path: Path, plant: Plant, processes: list[subprocess.Popen[str]]
) -> None:
    """A second plane on a busy port must not silently share it (gRPC's
    SO_REUSEPORT would let the kernel split traffic between the two)."""
    config_path = write_config(tmp_path / "cli")
    process = start_serve(processes, config_path, plant.target)
    try:
        _, stderr = process.communicate(timeout=60)  # a start on a busy machine takes long
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate(timeout=10)
        pytest.fail(f"warden serve kept running on {plant.target}, already in use:\n{stderr}")
    assert process.returncode != 0
    assert plant.target in stderr
    assert "Traceback" not in stderr
    assert not (config_path.parent / "var").exists(), "it wrote key files before failing"


@pytest.mark.fixed_processes
@pytest.mark.parametrize(
    ("option", "address", "said"),
    [
        ("--listen", "nonsense", "cannot listen on nonsense"),
        # The resolver takes any number: 99999 would have been port 34463.
        ("--listen", "127.0.0.1:99999", "cannot listen on 127.0.0.1:99999"),
        ("--metrics-listen", "127.0.0.1:99999", "cannot serve metrics on 127.0.0.1:99999"),
    ],
)
def test_serve_with_an_unusable_listen_address_is_a_clear_error(
    tmp_path: Path, option: str, address: str, said: str
) -> None:
    config_path = write_config(tmp_path / "cli")
    done = warden_exits("serve", "--config", str(config_path), option, address)
    assert done.returncode == 1
    assert f"Error: {said}: not HOST:PORT with a port from 0 to 65535" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not (config_path.parent / "var").exists(), "it wrote key files before failing"


@pytest.mark.fixed_processes
def test_serve_names_every_missing_key_file_at_its_line_before_making_anything(
    tmp_path: Path,
) -> None:
    config_path = write_config(tmp_path / "cli")
    text = config_path.read_text()
    config_path.write_text(
        text.replace(
            'listen = "127.0.0.1:0"\n',
            'listen = "127.0.0.1:0"\ntls_cert_file = "c.pem"\ntls_key_file = "c.key"\n',
        )
        + '\n[grants]\nverification_key_files = ["gone.pem"]\n'
        + '\n[audit]\ncheckpoint_key_file = "ck.pem"\n'
    )
    said, at = refused_at_start(config_path)

    folder = config_path.parent
    assert said == [
        f"Error: {config_path}: files it names are missing or unusable:",
        f"  {config_path}:{at('tls_cert_file')}: server.tls_cert_file: "
        f"no such file {folder / 'c.pem'}",
        f"  {config_path}:{at('tls_key_file')}: server.tls_key_file: "
        f"no such file {folder / 'c.key'}",
        f"  {config_path}:{at('verification_key_files')}: grants.verification_key_files[0]: "
        f"no such file {folder / 'gone.pem'}",
        f"  {config_path}:{at('checkpoint_key_file')}: audit.checkpoint_key_file: "
        f"no such file {folder / 'ck.pem'}",
    ]
    assert not (folder / "var").exists(), "it made the store before failing"


@pytest.mark.fixed_processes
def test_serve_names_every_key_of_the_wrong_kind_at_its_line_before_making_anything(
    tmp_path: Path,
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    config_path = write_config(tmp_path / "cli")
    folder = config_path.parent
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (folder / "rsa.pem").write_bytes(
        rsa_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (folder / "public.pem").write_bytes(
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    (folder / "junk.pem").write_text("not a key\n")
    config_path.write_text(
        config_path.read_text()
        + '\n[grants]\nsigning_key_file = "public.pem"\nverification_key_files = ["junk.pem"]\n'
        + '\n[audit]\ncheckpoint_key_file = "rsa.pem"\n'
    )
    said, at = refused_at_start(config_path)

    assert said == [
        f"Error: {config_path}: files it names are missing or unusable:",
        f"  {config_path}:{at('signing_key_file')}: grants.signing_key_file: "
        f"{folder / 'public.pem'} is a public key; grants are signed with the private one",
        f"  {config_path}:{at('verification_key_files')}: grants.verification_key_files[0]: "
        f"{folder / 'junk.pem'} is not a PEM key without a password",
        f"  {config_path}:{at('checkpoint_key_file')}: audit.checkpoint_key_file: "
        f"{folder / 'rsa.pem'} holds a private RSA key; it must be Ed25519",
    ]
    assert not (folder / "var").exists(), "it made the store before failing"


@pytest.mark.fixed_processes
def test_serve_names_tls_files_that_cannot_serve_at_their_lines_before_making_anything(
    tmp_path: Path,
) -> None:
    """gRPC would say only that it could not bind the port."""
    from tests.integration.test_tls import Authority

    config_path = write_config(tmp_path / "cli")
    folder = config_path.parent
    authority = Authority(folder, "ca")
    _, cert = authority.issue("plane")
    other_key, _ = authority.issue("other")
    (folder / "junk.pem").write_text("not a certificate\n")
    text = config_path.read_text().replace(
        'listen = "127.0.0.1:0"\n',
        'listen = "127.0.0.1:0"\n'
        f'tls_cert_file = "{cert.name}"\ntls_key_file = "{other_key.name}"\n'
        'tls_client_ca_file = "junk.pem"\n',
    )
    config_path.write_text(text)
    said, at = refused_at_start(config_path)

    assert said == [
        f"Error: {config_path}: files it names are missing or unusable:",
        f"  {config_path}:{at('tls_key_file')}: server.tls_key_file: {other_key} is not the "
        f"private key of the certificate in {cert}",
        f"  {config_path}:{at('tls_client_ca_file')}: server.tls_client_ca_file: "
        f"{folder / 'junk.pem'} holds no PEM certificate",
    ]
    assert not (folder / "var").exists(), "it made the store before failing"


@pytest.mark.fixed_processes
def test_serve_with_no_policy_folder_says_so_before_making_the_store(tmp_path: Path) -> None:
    config_path = write_config(tmp_path / "cli")
    done = warden_exits(
        "serve", "--config", str(config_path), "--policies", "nowhere", cwd=tmp_path
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[1:] == [
        f"  server.policies: no such folder {tmp_path / 'nowhere'} (from the command line)"
    ]
    assert not (config_path.parent / "var").exists(), "it made the store before failing"


@pytest.mark.fixed_processes
def test_serve_takes_a_store_url_on_the_command_line_as_a_url(tmp_path: Path) -> None:
    """--store postgresql://... is the database, not a path under the current
    folder where the plane would make a SQLite file (and its keys)."""
    config_path = write_config(tmp_path / "cli")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    url = f"postgresql://warden@127.0.0.1:{port}/warden"
    done = warden_exits("serve", "--config", str(config_path), "--store", url, cwd=tmp_path)
    assert done.returncode == 1
    assert f"Error: {url}: cannot connect" in done.stderr, done.stderr
    assert not (tmp_path / "postgresql:").exists()


@pytest.mark.fixed_processes
@pytest.mark.parametrize("address", ["nonsense", "127.0.0.1:99999", "taken"])
def test_console_with_an_unusable_listen_address_is_a_clear_error(
    tmp_path: Path, address: str
) -> None:
    """One line, and no "console on ..." announced for an address it never served."""
    config_path = write_config(tmp_path / "cli")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        if address == "taken":
            address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = warden_exits("console", "--config", str(config_path), "--listen", address)
    assert done.returncode == 1
    (said,) = done.stderr.splitlines()
    assert said.startswith(f"Error: cannot listen on {address}: "), said
    if ":" not in address or address.endswith("99999"):
        assert said.endswith("not HOST:PORT with a port from 0 to 65535"), said


def store_that_is_not_a_file(path: Path) -> Path:
    path.mkdir()
    return path


def store_that_is_not_a_database(path: Path) -> Path:
    path.write_text("not a database at all\n")
    return path


def store_from_a_newer_warden(path: Path) -> Path:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 999")
    conn.close()
    return path


@pytest.mark.fixed_processes
@pytest.mark.parametrize(
    ("make", "why"),
    [
        (store_that_is_not_a_file, "it is a folder, not a file"),
        (store_that_is_not_a_database, "file is not a database"),
        (store_from_a_newer_warden, "its schema version 999 is newer than this Warden's"),
    ],
    ids=["directory", "not-a-database", "newer-schema"],
)
def test_serve_on_a_store_it_cannot_open_says_so_in_one_line(
    tmp_path: Path, make: Callable[[Path], Path], why: str
) -> None:
    store = make(tmp_path / "warden.db")
    config_path = write_config(tmp_path / "cli")
    done = warden_exits("serve", "--config", str(config_path), "--store", str(store))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(
        f"Error: {store}: cannot open the store: {why}"
    ), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    # The store is opened before any key is made beside it.
    assert not default_key_path(store).exists(), "it made a grant key beside a store it cannot open"


@pytest.mark.fixed_processes
def test_serve_stops_on_sigterm_after_whoever_read_its_output_went_away(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """A supervisor that stopped reading the plane's output (a log pipe
    closed) must still be able to stop it. Its notice of the signal, written
    to a pipe nobody reads, raised from the signal handler before the stop,
    and the first process then waited at its exit, for good, for another
    process that nobody had told to stop."""
    config_path = write_config(tmp_path / "cli")
    target = f"127.0.0.1:{free_port()}"
    process = start_serve(processes, config_path, target, stdout=subprocess.DEVNULL)
    wait_until_serving(target, process, seconds=30)
    tree = process_tree(process.pid)
    assert len(tree) >= 3, "the plane should run two processes and the forkserver"
    assert process.stderr is not None
    process.stderr.close()  # nobody reads what it says any more
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail("warden serve did not stop within 30 s of SIGTERM")
    assert process.returncode == 0
    deadline = time.monotonic() + 10
    while (alive := [pid for pid in tree[1:] if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, f"processes left behind: {alive}"


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


STUCK_FORKSERVER = """\
import os, pathlib, time
if b"forkserver" in pathlib.Path("/proc/self/cmdline").read_bytes():
    pathlib.Path(os.environ["STUCK_FORKSERVER_PID"]).write_text(str(os.getpid()))
    time.sleep(600)
"""


@pytest.mark.fixed_processes
def test_a_failed_start_does_not_wait_for_the_forkserver_to_import_the_plane(
    tmp_path: Path,
) -> None:
    """The forkserver starts first and imports the plane (a second or more)
    while the first process loads; a start that fails must not leave it
    holding the caller's stdout and stderr open until that import ends. Here
    its import never ends: the interpreter stops it in ``sitecustomize``."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(STUCK_FORKSERVER)
    pid_file = tmp_path / "forkserver.pid"
    env = {**os.environ, "PYTHONPATH": str(hooks), "STUCK_FORKSERVER_PID": str(pid_file)}
    store = store_that_is_not_a_file(tmp_path / "warden.db")
    config_path = write_config(tmp_path / "cli")
    command = [*warden_command(), "serve", "--config", str(config_path), "--store", str(store)]
    try:
        done = subprocess.run(
            [*command, "--processes", "2"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert pid_file.exists(), "no forkserver was started: the test proves nothing"
        assert done.returncode == 1
        assert done.stderr.splitlines()[-1].startswith(f"Error: {store}: cannot open the store")
    except subprocess.TimeoutExpired:
        pytest.fail("the failed start's output stayed open while the forkserver imported")
    finally:
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def serve_until_ready(
    processes: list[subprocess.Popen[str]], config_path: Path, *args: str
) -> tuple[int, str]:
    """Run ``warden serve``: its exit status and standard error once it stopped
    by itself, or once it served (then it is stopped with SIGTERM)."""
    target = f"127.0.0.1:{free_port()}"
    process = start_serve(processes, config_path, target, *args)
    try:
        wait_until_serving(target, process, seconds=30)
    except RuntimeError:
        pass  # it stopped by itself
    else:
        process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    return process.returncode, stderr


@pytest.mark.heavy
@pytest.mark.fixed_processes
def test_serve_moves_metrics_off_a_taken_port_with_metrics_listen(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """A second plane on one machine: the metrics port its config names is taken."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        config_path = write_config(tmp_path / "cli")
        with config_path.open("a") as config:
            config.write(f'\n[telemetry]\nmetrics_listen = "{busy}"\n')

        code, stderr = serve_until_ready(processes, config_path)
        assert code == 1
        assert stderr.splitlines()[-1] == (
            f"Error: cannot serve metrics on {busy}: the port is in use; move it with "
            "--metrics-listen HOST:PORT, or turn it off with --metrics-listen off"
        )
        assert "Traceback" not in stderr
        assert not (config_path.parent / "var").exists(), "it wrote key files before failing"

        moved = f"127.0.0.1:{free_port()}"
        code, stderr = serve_until_ready(processes, config_path, "--metrics-listen", moved)
        assert code == 0, stderr
        assert f"metrics on http://{moved}/metrics" in stderr

        code, stderr = serve_until_ready(processes, config_path, "--metrics-listen", "off")
        assert code == 0, stderr
        assert "metrics on" not in stderr


# -- one wording for a plane that is not there ---------------------------------------

PLANE_COMMANDS = [
    ("audit", "query"),
    ("audit", "stats"),
    ("audit", "export"),
    ("approvals", "list"),
    ("approvals", "show", "some-id"),
    ("policy", "status"),
    ("policy", "capabilities"),
    ("policy", "check", str(EXAMPLE_POLICIES)),
]


class QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Keep the test's output clean."""


@pytest.fixture
def http_port() -> Iterator[str]:
    """A port that answers HTTP, as the plane's metrics port does, but not gRPC."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.fixed_processes
@pytest.mark.parametrize("command", PLANE_COMMANDS, ids=" ".join)
def test_every_command_says_no_plane_at_target_alike(
    command: tuple[str, ...], http_port: str
) -> None:
    closed = f"127.0.0.1:{free_port()}"
    for target, why in (
        (closed, "nothing listens on that port"),
        (http_port, "something answers on that port, but not in gRPC (is it the metrics port?)"),
    ):
        result = run(*command, "--target", target, "--token", "any-token")
        assert result.exit_code == 1
        assert result.output == f"Error: no plane at {target}: {why}\n"


@pytest.mark.fixed_processes
@pytest.mark.parametrize("command", PLANE_COMMANDS, ids=" ".join)
def test_every_command_refuses_a_target_that_is_not_host_port(command: tuple[str, ...]) -> None:
    """gRPC would take port 99999 as port 34463, another plane's perhaps."""
    for target in ("127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1", ":50051", "host:port"):
        result = run(*command, "--target", target, "--token", "any-token")
        assert result.exit_code == 2, (target, result.output)
        assert f"{target!r} is not HOST:PORT with a port from 1 to 65535" in result.output


def test_a_plane_that_answers_is_quoted_with_its_status_alike(plant: Plant) -> None:
    outsider = plant.token(roles=("support",))
    for command in [c for c in PLANE_COMMANDS if c[0] != "approvals"]:
        result = run(*command, "--target", plant.target, "--token", outsider)
        assert result.exit_code == 1
        assert result.output.startswith(f"Error: {plant.target} answered PERMISSION_DENIED: ")
    result = run("approvals", "show", "nope", "--target", plant.target, "--token", outsider)
    assert result.output == f"Error: {plant.target} answered NOT_FOUND: approval 'nope' not found\n"


def test_policy_status_finds_the_plane_as_approvals_do(plant: Plant) -> None:
    """Both default --target the same way (127.0.0.1:50051, or WARDEN_TARGET)."""
    by_path = {" ".join(path): command for path, command in COMMANDS}
    for path in ("policy status", "approvals list"):
        (target,) = [p for p in by_path[path].params if p.name == "target"]
        assert (target.default, target.envvar) == ("127.0.0.1:50051", "WARDEN_TARGET"), path
    token = plant.token(roles=("policy-author",))
    runner = CliRunner(env={"WARDEN_TARGET": plant.target})
    result = runner.invoke(main, ["policy", "status", "--token", token], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("in force: revision ")


# -- policy check / test ----------------------------------------------------------------


@pytest.mark.fixed_processes
def test_policy_check_accepts_the_example_policies() -> None:
    result = run("policy", "check", str(EXAMPLE_POLICIES))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok: 7 rules, 2 limits in 1 file, 14 test cases (revision ")


@pytest.mark.fixed_processes
def test_policy_check_reports_file_line_col_and_exits_1(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "rules.yaml").write_text(BROKEN_POLICY)
    result = run("policy", "check", str(folder))
    assert result.exit_code == 1
    # Problems on stdout, like a linter's; the count on stderr.
    assert result.stdout.startswith(f"{folder / 'rules.yaml'}:8:")
    assert result.stderr.endswith("in 1 file\n")


@pytest.mark.fixed_processes
def test_policy_test_passes_the_example_suite_with_full_coverage() -> None:
    result = run("policy", "test", str(EXAMPLE_POLICIES))
    assert result.exit_code == 0, result.output
    assert "FAIL" not in result.stdout
    assert (
        "0 failed; coverage 100% (rules 7/7, limits 2/2, condition outcomes 24/24)" in result.stdout
    )
    assert "rules no test exercised" not in result.stdout
    assert "condition outcomes no test produced" not in result.stdout


@pytest.mark.fixed_processes
def test_policy_test_exits_1_on_a_failing_case_and_says_which(tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    shutil.copytree(EXAMPLE_POLICIES, folder)
    (folder / "tests" / "wrong.yaml").write_text(
        """\
tests:
  - name: a customer's refund is wrongly expected to pass
    capability: orders.refund
    actor: {id: carol, roles: [customer], tenant: acme}
    input: {order_id: A1, amount: 10}
    expect: {effect: allow}
"""
    )
    result = run("policy", "test", str(folder))
    assert result.exit_code == 1
    assert "FAIL  a customer's refund is wrongly expected to pass" in result.stdout
    assert "1 failed" in result.stdout
    assert "      matched  no rule\n" in result.stdout


REFUND_WITHOUT_AMOUNT = """\
tests:
  - name: a refund without an amount
    capability: orders.refund
    actor: {id: bot-7, roles: [support], tenant: acme}
    input: {order_id: A1}
    expect: {effect: allow}
"""


@pytest.mark.fixed_processes
def test_a_failing_policy_test_says_which_rules_matched_and_why_others_failed(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "policies"
    shutil.copytree(EXAMPLE_POLICIES, folder)
    # Without the schemas, the input reaches the rules (with them, see below).
    (folder / "capabilities.json").unlink()
    (folder / "tests" / "wrong.yaml").write_text(REFUND_WITHOUT_AMOUNT)
    result = run("policy", "test", str(folder), "--run", "without an amount")
    assert result.exit_code == 1
    assert "      got      {'effect': 'error'}\n      matched  support-may-refund\n" in (
        result.stdout
    )
    assert (
        "      rule 'refunds-over-500-need-a-manager' failed to evaluate: no such key: amount\n"
    ) in result.stdout
    # An erroring rule is not covered.
    assert "rules no test exercised: " in result.stdout
    assert "refunds-over-500-need-a-manager" in result.stdout.split("rules no test exercised: ")[1]
    as_json = run("policy", "test", str(folder), "--run", "without an amount", "--json")
    case = json.loads(as_json.stdout.splitlines()[0])
    assert case["matched"] == ["support-may-refund"]
    assert {"rule": "no-refunds-above-10000", "error": "no such key: amount"} in case["errors"]


NUMBER_RULES = """\
rules:
  - id: too-dear
    capabilities: ["shop.buy"]
    effect: deny
    when: input.price * 1.2 > 1000.0 || input.lines.exists(l, l.weight / 2.0 > 100.0)
  - id: buy
    capabilities: ["shop.buy"]
    effect: allow
"""
NUMBER_CASES = """\
tests:
  - name: a whole price
    capability: shop.buy
    input: {price: 100, lines: [{weight: 3}]}
    expect: {effect: allow, rule: buy}
  - name: a whole price too dear
    capability: shop.buy
    input: {price: 1000, lines: []}
    expect: {effect: deny, rule: too-dear}
  - name: a heavy line
    capability: shop.buy
    input: {price: 10.5, lines: [{weight: 300}]}
    expect: {effect: deny, rule: too-dear}
"""
PRICED = {
    "id": "shop.buy",
    "version": "1",
    "service": "shop",
    "side_effect": "write",
    "tags": [],
    "input_schema": {
        "type": "object",
        "properties": {
            "price": {"type": "number"},
            "lines": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"weight": {"type": "number"}},
                    "additionalProperties": False,
                },
            },
        },
        "required": ["price", "lines"],
        "additionalProperties": False,
    },
}
SIDE_EFFECT_RULES = """\
rules:
  - id: reads-are-free
    capabilities: ["orders.*"]
    effect: allow
    when: capability.side_effect == "read" && capability.version == "1"
"""
SIDE_EFFECT_CASE = """\
tests:
  - name: looking an order up reads, so it is allowed
    capability: orders.get
    actor: {id: alice, roles: [], tenant: acme}
    input: {order_id: A1}
    expect: {effect: allow, rule: reads-are-free}
"""


@pytest.mark.fixed_processes
def test_policy_test_calls_a_capability_named_by_id_as_registered(tmp_path: Path) -> None:
    """orders.get reads (DIRECTORY/capabilities.json says so, as the plane's
    registry would): a case naming it by id is decided with that, as the
    plane decides, not with made-up facts ("write")."""
    folder = tmp_path / "policies"
    (folder / "tests").mkdir(parents=True)
    (folder / "rules.yaml").write_text(SIDE_EFFECT_RULES)
    (folder / "tests" / "reads.yaml").write_text(SIDE_EFFECT_CASE)
    shutil.copy(EXAMPLE_POLICIES / "capabilities.json", folder)
    result = run("policy", "test", str(folder))
    assert result.exit_code == 0, result.output
    assert "1 passed, 0 failed" in result.stdout
    assert "capabilities not" not in result.stderr
    # Without a source of capabilities, the case says what it was called with.
    (folder / "capabilities.json").unlink()
    unknown = run("policy", "test", str(folder), "--json")
    assert unknown.exit_code == 1
    assert json.loads(unknown.stdout.splitlines()[-1])["summary"]["unregistered_capabilities"] == [
        "orders.get"
    ]
    assert (
        "capabilities not known (give --target and --token, --store, or keep "
        'DIRECTORY/capabilities.json): orders.get; the cases naming them call them as version "1", '
        'service "", side effect "write", without tags\n'
    ) in unknown.stderr
    # A snapshot given that does not hold it says so too.
    snapshot = tmp_path / "other.json"
    snapshot.write_text(json.dumps({"capabilities": []}))
    elsewhere = run("policy", "test", str(folder), "--capabilities", str(snapshot))
    assert f"capabilities not in the snapshot {snapshot}: orders.get;" in elsewhere.stderr


@pytest.mark.fixed_processes
def test_policy_test_refuses_a_snapshot_whose_capability_is_malformed(tmp_path: Path) -> None:
    snapshot = tmp_path / "capabilities.json"
    snapshot.write_text(
        json.dumps(
            {"capabilities": [{"id": "orders.get", "input_schema": {}, "side_effect": "sometimes"}]}
        )
    )
    result = run("policy", "test", str(EXAMPLE_POLICIES), "--capabilities", str(snapshot))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: snapshot {snapshot}: capabilities[0]: side_effect: ")


@pytest.mark.fixed_processes
def test_a_policy_test_whose_input_the_plane_refuses_fails_and_says_why(tmp_path: Path) -> None:
    """The plane validates the input before any rule but the hide rules
    (SI-2): a case whose input fails the capability's schema tests nothing
    the plane would do, so it fails, naming the issue; a hidden capability's
    case needs no valid input (the example's export case has none)."""
    folder = tmp_path / "policies"
    shutil.copytree(EXAMPLE_POLICIES, folder)
    (folder / "tests" / "wrong.yaml").write_text(REFUND_WITHOUT_AMOUNT)
    result = run("policy", "test", str(folder))
    assert result.exit_code == 1
    assert (
        "FAIL  a refund without an amount\n"
        f"      {folder / 'tests' / 'wrong.yaml'}:2\n"
        "      expected {'effect': 'allow'}\n"
        "      got      {'effect': 'invalid'}\n"
        "      matched  no rule\n"
        "      the plane refuses the input (INPUT_INVALID): /amount: is required\n"
    ) in result.stdout
    assert "14 passed, 1 failed" in result.stdout  # the export case, hidden, has no input
    as_json = run("policy", "test", str(folder), "--run", "without an amount", "--json")
    case = json.loads(as_json.stdout.splitlines()[0])
    assert case["input_issues"] == ["/amount: is required"]


@pytest.mark.fixed_processes
def test_policy_test_types_whole_numbers_as_the_plane_does(tmp_path: Path) -> None:
    """A `number` field is a double to the checker, which has rules compare it
    with doubles; a whole value (YAML's 100, JSON's 100.0) must reach the rule
    as a double too, or the rule fails to evaluate."""
    folder = tmp_path / "policies"
    (folder / "tests").mkdir(parents=True)
    (folder / "rules.yaml").write_text(NUMBER_RULES)
    (folder / "tests" / "prices.yaml").write_text(NUMBER_CASES)
    (folder / "capabilities.json").write_text(json.dumps({"capabilities": [PRICED]}))
    result = run("policy", "test", str(folder))
    assert result.exit_code == 0, result.output
    assert "3 passed, 0 failed" in result.stdout
    explained = run(
        "policy",
        "explain",
        str(folder),
        "--capability",
        "shop.buy",
        "--input",
        '{"price": 1000.0, "lines": [{"weight": 3}]}',
        "--actor-claims",
        '{"sub": "alice"}',
    )
    assert explained.exit_code == 0, explained.output
    assert "decision: deny, by too-dear" in explained.stdout


@pytest.mark.fixed_processes
def test_policy_test_reports_rules_no_test_exercised(tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    shutil.copytree(EXAMPLE_POLICIES, folder)
    (folder / "tests" / "orders.yaml").write_text(
        """\
tests:
  - name: support can make a small refund
    capability: orders.refund
    actor: {id: bot-7, roles: [support], tenant: acme}
    input: {order_id: A1, amount: 120}
    expect: {effect: allow, rule: support-may-refund}
"""
    )
    result = run("policy", "test", str(folder), "--min-coverage", "100")
    assert result.exit_code == 1
    assert "rules no test exercised: " in result.stdout
    assert "admins-may-export" in result.stdout
    # The case also makes the audit-mode rollout rule match: 2 of 7; and it
    # counts against both limits.
    assert "coverage 42% (rules 2/7, limits 2/2, condition outcomes 10/24)" in result.stdout
    assert (
        "orders.yaml:40: agent-refunds-over-100-need-approval: "
        "operand `input.amount > 100` never false"
    ) in result.stdout


# -- audit verify / query ------------------------------------------------------------------


@pytest.fixture
def audited(lab_plant: Plant, lab_rt: warden.Runtime) -> Plant:
    """A store with registry, decision and outcome records in it."""
    actor = lab_plant.token()
    assert lab_rt.invoke("orders.echo", {"n": 1}, actor=actor).status == "succeeded"
    assert lab_rt.invoke("orders.echo", {"n": 101}, actor=actor).status == "failed"
    assert lab_rt.invoke("orders.nope", {"n": 1}, actor=actor).status == "failed"
    return lab_plant


def test_audit_verify_prints_ok_on_a_good_store(audited: Plant) -> None:
    count = len(audited.rows())
    result = run("audit", "verify", "--store", str(audited.db_path))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"ok: {count} records, chain intact"


def test_audit_verify_names_the_edited_record(audited: Plant) -> None:
    with sqlite3.connect(audited.db_path) as conn:
        conn.execute("UPDATE audit_events SET public_message = 'x' WHERE seq = 2")
    result = run("audit", "verify", "--store", str(audited.db_path))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert (
        "TAMPERED at seq 2: the record was edited: its hash does not match its contents"
        in result.stderr
    )
    assert "(1 records verified before it)" in result.stderr


def test_audit_verify_names_the_first_missing_record(audited: Plant) -> None:
    with sqlite3.connect(audited.db_path) as conn:
        conn.execute("DELETE FROM audit_events WHERE seq = 3")
    result = run("audit", "verify", "--store", str(audited.db_path))
    assert result.exit_code == 1
    assert "TAMPERED at seq 3" in result.stderr


@pytest.mark.fixed_processes
def test_audit_verify_on_a_missing_store_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    result = run("audit", "verify", "--store", str(missing))
    assert result.exit_code == 3  # not verified: no verdict on a log it never read
    assert f"{missing}: no such store" in result.stderr
    assert not missing.exists()


@pytest.mark.fixed_processes
def test_audit_verify_on_a_folder_says_so_and_does_not_call_it_corrupt(tmp_path: Path) -> None:
    folder = tmp_path / "warden.db"
    folder.mkdir()
    result = run("audit", "verify", "--store", str(folder))
    # Not verified (3): 1 would say tampered, 2 that the file is damaged.
    assert result.exit_code == 3, result.stderr
    assert result.stderr.strip() == f"Error: {folder}: not a store: it is a folder, not a file"


@pytest.mark.fixed_processes
@pytest.mark.parametrize("command", ["verify", "query"])
def test_audit_commands_on_a_file_that_is_not_a_store_are_a_clear_error(
    tmp_path: Path, command: str
) -> None:
    bogus = tmp_path / "notes.db"
    bogus.write_text("not a database at all\n")
    result = CliRunner().invoke(main, ["audit", command, "--store", str(bogus)])
    # verify gives its verdict on the file: damaged (2); query just cannot read it (1).
    assert result.exit_code == (2 if command == "verify" else 1)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert str(bogus) in result.stderr
    assert bogus.read_text() == "not a database at all\n"


@pytest.mark.fixed_processes
@pytest.mark.parametrize("command", ["verify", "query", "head", "stats"])
def test_audit_commands_leave_a_database_no_plane_made_untouched(
    tmp_path: Path, command: str
) -> None:
    """Someone else's SQLite database given as --store: refused in one line,
    and not a byte of it (or beside it) written; verify does not call it intact."""
    other = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
    before = other.read_bytes()
    result = CliRunner().invoke(main, ["audit", command, "--store", str(other)])
    assert result.exit_code == (3 if command == "verify" else 1), result.output
    assert f"{other}: not a Warden store" in result.stderr
    assert other.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_audit_query_json_lines_have_the_column_names_as_keys(audited: Plant) -> None:
    result = run("audit", "query", "--store", str(audited.db_path), "--json", "--kind", "decision")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    with sqlite3.connect(audited.db_path) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(audit_events)")]
    decisions = audited.events(kind="decision")
    assert len(records) == len(decisions) == 3
    for record in records:
        assert list(record) == columns
        assert record["kind"] == "decision"
    assert [r["seq"] for r in records] == sorted((d["seq"] for d in decisions), reverse=True)
    assert [r["code"] for r in records] == ["CAPABILITY_NOT_FOUND", "POLICY_DENIED", None]


def test_audit_query_filters_and_prints_a_table_by_default(audited: Plant) -> None:
    result = run(
        "audit", "query", "--store", str(audited.db_path), "--code", "POLICY_DENIED",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    header, *lines = result.stdout.splitlines()
    assert header.split() == [
        "seq", "ts", "kind", "status", "capability_id", "actor_id", "tenant", "stage", "code",
        "reason",
    ]  # fmt: skip
    assert len(lines) == 1
    assert "orders.echo" in lines[0] and "POLICY_DENIED" in lines[0]


# -- help ----------------------------------------------------------------------------------


def every_command(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in sorted(command.list_commands(context)):
            sub = command.get_command(context, name)
            assert sub is not None, name
            yield from every_command(sub, (*path, name))


COMMANDS = list(every_command(main))


@pytest.mark.fixed_processes
def test_the_cli_has_the_expected_commands() -> None:
    paths = {" ".join(path) for path, _ in COMMANDS}
    assert {
        "",
        "serve",
        "token",
        "token mint",
        "policy",
        "policy check",
        "policy test",
        "audit",
        "audit verify",
        "audit query",
    } <= paths


@pytest.mark.fixed_processes
@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(p) or "warden" for p, _ in COMMANDS]
)
def test_every_command_has_help_text(path: tuple[str, ...], command: click.Command) -> None:
    assert command.help and command.help.strip(), f"{' '.join(path)} has no help text"
    result = run(*path, "--help")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: ")
    assert command.help.split("\n")[0].strip()[:40] in " ".join(result.stdout.split())
