"""A throw-away PostgreSQL server (for the tests and the benchmarks):
``initdb`` into a temporary folder and ``postgres`` on a Unix socket there.

The binaries are Debian's ``postgresql`` package (``/usr/lib/postgresql/N/bin``)
or any ``initdb`` on the PATH. PostgreSQL refuses to run as root: as root the
server runs as ``nobody``. Durability settings are off (``fsync=off``): what
is measured or tested is the plane, not the disk.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg

USER = "warden"


DEBIAN_BINARIES = "/usr/lib/postgresql/*/bin/initdb"
"""Where Debian's ``postgresql`` package puts them: not on the PATH."""


def binaries(path: str | None = None, debian: str = DEBIAN_BINARIES) -> Path | None:
    """The folder of ``initdb``, ``pg_ctl`` and ``postgres``, if installed: the
    one of an ``initdb`` on ``path`` (default: the PATH; a symlink is followed
    to the folder that holds all three), else Debian's newest version."""
    found = shutil.which("initdb", path=path)
    if found:
        return Path(found).resolve().parent
    candidates = sorted(glob.glob(debian), key=_major_version, reverse=True)
    return Path(candidates[0]).parent if candidates else None


def _major_version(initdb: str) -> int:
    """16 for ``/usr/lib/postgresql/16/bin/initdb`` (so 16 sorts above 9.6)."""
    version = Path(initdb).parent.parent.name.split(".")[0]
    return int(version) if version.isdigit() else 0


class Server:
    """One throw-away server, on a Unix socket in its own folder."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="wpg"))  # short: a socket path is < 108 bytes
        self.data = self.root / "data"
        self._as: list[str] = []
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self.root, nobody.pw_uid, nobody.pw_gid)
            self._as = ["runuser", "-u", "nobody", "--"]

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self._run(
            str(self.bin_dir / "initdb"),
            "-D", str(self.data), "-A", "trust", "-U", USER, "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        options = (
            f"-k {self.root} -c listen_addresses='' -c max_connections=300 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-o", options,
            "-l", str(self.root / "log"), "-w", "-t", "60", "start",
        )  # fmt: skip

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@/{database}?host={self.root}"

    def fresh_database(self) -> str:
        """The URL of a new, empty database."""
        name = "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
