"""The README's quick start works as written: the example service against a
plane served from the repository's own warden.toml."""

from __future__ import annotations

import os
import pty
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from warden_server.app import Server


def readme_outcomes() -> list[tuple[str, str]]:
    """(capability, status) pairs from the README's quick-start output."""
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^(orders\.\w+) \{.*?\} -> (\w+):", text, flags=re.M)


@pytest.mark.fixed_processes
def test_readme_opens_with_make_run_and_make_test() -> None:
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.strip()]
    commands = [line.split("#")[0].strip() for line in lines[1:5] if line.startswith("make ")]
    assert commands == ["make run", "make test"]


@pytest.mark.fixed_processes
def test_ci_runs_exactly_make_test() -> None:
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    assert [line for line in script if line and not line.startswith(("#", "set ", "cd "))] == [
        "make test"
    ]


QUICK_START = ".venv/bin/python examples/orders/service.py"


def run_example(script: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run an example as a newcomer would: with this Python, but without its
    virtual environment on PATH."""
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env={**os.environ, "PATH": os.defpath, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_quick_start_example_runs_as_the_readme_shows(dev_plane: Server) -> None:
    text = (ROOT / "README.md").read_text()
    assert f"\n{QUICK_START}\n" in text, "the quick start runs the example with the venv's Python"
    result = run_example(Path("examples/orders/service.py"), ROOT, WARDEN_TARGET=dev_plane.target)
    assert result.returncode == 0, result.stderr
    shown = re.findall(r"^(orders\.\w+) \{.*?\} -> (\w+):", result.stdout, flags=re.M)
    assert shown == readme_outcomes()
    assert shown, "the README shows the example's output"


def test_quick_start_example_runs_from_its_own_folder(dev_plane: Server) -> None:
    folder = ROOT / "examples" / "orders"
    result = run_example(Path("service.py"), folder, WARDEN_TARGET=dev_plane.target)
    assert result.returncode == 0, result.stderr
    assert re.findall(r"^(orders\.\w+) \{.*?\} -> (\w+):", result.stdout, flags=re.M) == (
        readme_outcomes()
    )


@pytest.mark.fixed_processes
def test_quick_start_example_says_when_its_config_is_missing(tmp_path: Path) -> None:
    copy = tmp_path / "checkout" / "examples" / "orders" / "service.py"
    copy.parent.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "orders" / "service.py", copy)
    result = run_example(copy, copy.parent)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"cannot mint a development token: {tmp_path / 'checkout' / 'warden.toml'}: "
        "no such config file"
    )


@pytest.mark.fixed_processes
def test_quick_start_example_says_when_no_plane_serves(unused_target: str) -> None:
    result = run_example(
        ROOT / "examples" / "orders" / "service.py", ROOT, WARDEN_TARGET=unused_target
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"registration failed: no plane at {unused_target}: nothing listens on that port "
        "(is `make run` serving?)"
    )


@pytest.fixture
def unused_target() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


MCP_EXAMPLE = ROOT / "examples" / "orders" / "mcp_server.py"


@pytest.mark.fixed_processes
def test_mcp_example_run_in_a_terminal_says_what_it_waits_for(unused_target: str) -> None:
    terminal, its_end = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, str(MCP_EXAMPLE)],
        stdin=its_end,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "WARDEN_ACTOR_TOKEN": "a-jwt", "WARDEN_TARGET": unused_target},
        text=True,
    )
    os.close(its_end)
    try:
        os.write(terminal, b"\x04")  # Ctrl-D: the end of its input
        _, stderr = process.communicate(timeout=60)
    finally:
        os.close(terminal)
    assert process.returncode == 0, stderr
    assert "This is an MCP server: it speaks JSON-RPC on stdin and stdout" in stderr


@pytest.mark.fixed_processes
def test_mcp_example_under_a_host_prints_no_hint(unused_target: str) -> None:
    done = subprocess.run(
        [sys.executable, str(MCP_EXAMPLE)],
        input="",
        env={**os.environ, "WARDEN_ACTOR_TOKEN": "a-jwt", "WARDEN_TARGET": unused_target},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")


@pytest.mark.fixed_processes
def test_mcp_example_without_an_actor_token_says_which_variable(unused_target: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "WARDEN_ACTOR_TOKEN"}
    done = subprocess.run(
        [sys.executable, str(MCP_EXAMPLE)],
        input="",
        env={**env, "WARDEN_TARGET": unused_target},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("set WARDEN_ACTOR_TOKEN to the JWT of the actor")
    assert "Traceback" not in done.stderr
