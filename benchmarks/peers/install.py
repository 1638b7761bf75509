"""Everything the peer benchmark needs beyond the virtual environment, installed
into one bench-local folder (``var/bench/peers``, ignored by git).

Each step is idempotent and cached: a second run finds the Cerbos binary and
the built generator and installs nothing. The only system package is
``libnghttp2-dev`` (the generator's HTTP/2 framing), installed with apt-get
when its header is missing; Cerbos comes from its npm package, which carries
the release binary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "var" / "bench" / "peers"
LOADGEN_SOURCE = ROOT / "benchmarks" / "loadgen"
CERBOS_PACKAGE = "@cerbos/cerbos-linux-x64"
CERBOS_VERSION = "0.55.0"
NGHTTP2_HEADER = Path("/usr/include/nghttp2/nghttp2.h")


class InstallError(Exception):
    """A prerequisite could not be installed; the message says what to do."""


def loadgen() -> Path:
    """Build the load generator (``make`` rebuilds only when the source changed)."""
    if not NGHTTP2_HEADER.exists():
        _apt_install("libnghttp2-dev")
    for tool in ("make", "cc"):
        if shutil.which(tool) is None:
            raise InstallError(
                f"the load generator needs `{tool}` (apt-get install build-essential)"
            )
    FOLDER.mkdir(parents=True, exist_ok=True)
    binary = FOLDER / "grpcload"
    _run(["make", "-s", "-C", str(LOADGEN_SOURCE), f"OUT={binary}"], "building the load generator")
    return binary


def cerbos() -> Path:
    """The Cerbos binary from its npm package, installed once per pinned version."""
    prefix = FOLDER / f"cerbos-{CERBOS_VERSION}"
    binary = prefix / "node_modules" / CERBOS_PACKAGE / "cerbos-linux-x64"
    if binary.exists():
        return binary
    if shutil.which("npm") is None:
        raise InstallError("the peer benchmark needs `npm` to install Cerbos (apt-get install npm)")
    print(f"  installing {CERBOS_PACKAGE}@{CERBOS_VERSION} into {_shown(prefix)}")
    prefix.mkdir(parents=True, exist_ok=True)
    _run(
        [
            "npm",
            "install",
            "--prefix",
            str(prefix),
            "--no-save",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            f"{CERBOS_PACKAGE}@{CERBOS_VERSION}",
        ],
        "installing Cerbos with npm",
    )
    if not binary.exists():
        found = sorted(p.name for p in binary.parent.glob("*")) if binary.parent.exists() else []
        raise InstallError(f"the npm package holds no `cerbos-linux-x64` binary (found {found})")
    binary.chmod(0o755)
    return binary


def _apt_install(package: str) -> None:
    if shutil.which("apt-get") is None:
        raise InstallError(
            f"the load generator needs {package}, and there is no apt-get here to install it"
        )
    print(f"  installing {package} with apt-get")
    command = ["apt-get", "install", "-y", "--no-install-recommends", package]
    environ = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environ)
    if done.returncode != 0:
        # A fresh machine's package lists may be missing or stale: refresh them once.
        _run(["apt-get", "update", "-q"], "apt-get update")
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=environ)
    if done.returncode != 0:
        raise InstallError(f"apt-get install {package} failed:\n{done.stderr.strip()}")
    for line in done.stdout.splitlines():
        if line.startswith(("Setting up", "Unpacking")):
            print(f"    {line}")


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InstallError(f"{what} failed:\n{(done.stderr or done.stdout).strip()}")


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
