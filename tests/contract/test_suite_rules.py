"""The suite's own rules, as pytest is configured in pyproject.toml: work a
test drops silently fails it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

DROPS_A_COROUTINE = """
import gc


async def send() -> None:
    pass


def test_drops_a_send() -> None:
    send()
    gc.collect()
"""


def test_a_coroutine_never_awaited_fails_the_test(tmp_path: Path) -> None:
    (tmp_path / "test_dropped.py").write_text(DROPS_A_COROUTINE)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_dropped.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "coroutine object send" in done.stdout, done.stdout
    assert "1 failed" in done.stdout, done.stdout
