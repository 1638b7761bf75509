"""The outbox file of a service, opened by several of its processes at once."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
from pathlib import Path

import warden
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


def test_a_send_started_while_the_outbox_closes_is_dropped_not_left_pending(
    tmp_path: Path,
) -> None:
    """A timer can start a send while the outbox shuts down; the loop stops
    before it would run, and a task left pending at the loop's close is
    destroyed unawaited. Once closing has begun, no new work starts (its
    reports stay in the file)."""
    rt = warden.Runtime(
        "127.0.0.1:9", service="orders", token="t", outbox=tmp_path / "outbox.sqlite"
    )
    outbox = rt._outbox
    try:
        asyncio.run_coroutine_threadsafe(outbox._shutdown(), outbox._loop).result(timeout=10)
        late = asyncio.sleep(3600)
        outbox._loop.call_soon_threadsafe(outbox._spawn, late)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), outbox._loop).result(timeout=10)
        assert late.cr_frame is None, "the late send was neither run nor closed"
        assert not outbox._tasks
    finally:
        rt.close()
