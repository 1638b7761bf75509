"""The outbox file of a service, opened by several of its processes at once."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from warden._outbox import _ReportFile


def test_processes_opening_one_outbox_take_turns(tmp_path: Path) -> None:
    """Turning a fresh file to WAL while another process opens it can fail at
    once with "database is locked": an opener waits for the one before it."""
    path = tmp_path / "outbox.sqlite"
    other = os.open(f"{path}.open-lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(other, fcntl.LOCK_EX)  # another process is opening the file
    opened = threading.Event()
    files: list[_ReportFile] = []

    def open_file() -> None:
        files.append(_ReportFile(path, "127.0.0.1:50051"))
        opened.set()

    opener = threading.Thread(target=open_file)
    opener.start()
    try:
        assert not opened.wait(0.3), "opened while another process was opening the file"
    finally:
        fcntl.flock(other, fcntl.LOCK_UN)
        os.close(other)
    assert opened.wait(10)
    opener.join()
    (opened_file,) = files
    try:
        assert opened_file.adopt() == []
    finally:
        opened_file.close()
