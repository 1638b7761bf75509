"""What a process started by ``test_store_startup.py`` runs: it opens a store
and closes it. A module of its own, so that each process started with
``spawn`` imports the store alone, not the test module and the plane with it."""

from __future__ import annotations

from multiprocessing.synchronize import Barrier

from warden_server.store.sqlite import SQLiteStore


def open_store(path: str, start: Barrier) -> None:
    start.wait()
    SQLiteStore(path).close()
