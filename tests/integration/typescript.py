"""The TypeScript SDK, built for tests: ``npm ci`` (unless one has finished)
and ``tsc``, one build at a time under ``client/typescript/.build.lock``,
whatever number of test workers ask at once; ``make ts-test``, which runs
beside the suite in ``make test``, builds under the same lock."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "client" / "typescript"
DIST = PACKAGE / "dist" / "test"
INSTALLED = PACKAGE / "node_modules" / ".installed-stamp"
"""What ``make`` touches once ``npm ci`` has finished (Makefile, ``NPM_STAMP``):
a ``node_modules`` an interrupted install left is not taken for finished."""


def build() -> Path:
    """Install (from the committed lockfile) and compile the TypeScript SDK.

    Returns:
        The folder of the compiled tests and their helper scripts.
    """
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("the TypeScript SDK tests need Node.js 20 and npm on the PATH")
    with (PACKAGE / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not INSTALLED.exists():
            _run([npm, "ci", "--no-audit", "--no-fund"])
            INSTALLED.touch()
        _run([npm, "run", "--silent", "build"])
    return DIST


def _run(command: list[str]) -> None:
    done = subprocess.run(command, cwd=PACKAGE, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        what = " ".join(command[1:])
        raise RuntimeError(f"{what} failed in client/typescript:\n{done.stdout}{done.stderr}")
