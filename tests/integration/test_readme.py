"""The README's quick start works as written: the example service against a
plane served from the repository's own warden.toml."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from warden_server.app import Server


def readme_outcomes() -> list[tuple[str, str]]:
    """(capability, status) pairs from the README's quick-start output."""
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^(orders\.\w+) \{.*?\} -> (\w+):", text, flags=re.M)


def test_readme_opens_with_make_run_and_make_test() -> None:
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.strip()]
    commands = [line.split("#")[0].strip() for line in lines[1:5] if line.startswith("make ")]
    assert commands == ["make run", "make test"]


def test_ci_runs_exactly_make_test() -> None:
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    assert [line for line in script if line and not line.startswith(("#", "set ", "cd "))] == [
        "make test"
    ]


def test_quick_start_example_runs_as_the_readme_shows(dev_plane: Server) -> None:
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "WARDEN_TARGET": dev_plane.target,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
    }
    result = subprocess.run(
        [sys.executable, "examples/orders/service.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    shown = re.findall(r"^(orders\.\w+) \{.*?\} -> (\w+):", result.stdout, flags=re.M)
    assert shown == readme_outcomes()
    assert shown, "the README shows the example's output"
