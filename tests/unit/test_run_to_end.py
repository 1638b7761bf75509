"""An attempt that waits by blocking (``BlockingWaits``) is a coroutine that
never suspends: ``run_to_end`` runs it on the calling thread, and refuses one
that does suspend rather than leave it half run."""

from __future__ import annotations

import asyncio
import threading

import pytest

from warden._execution import run_to_end


def test_a_coroutine_that_never_suspends_runs_to_its_end_on_the_calling_thread() -> None:
    async def inner() -> int:
        return threading.get_ident()

    async def outer() -> int:
        return await inner()

    assert run_to_end(outer()) == threading.get_ident()


def test_what_it_raises_reaches_the_caller() -> None:
    async def fails() -> None:
        raise LookupError("no such order")

    with pytest.raises(LookupError, match="no such order"):
        run_to_end(fails())


def test_a_coroutine_that_suspends_is_closed_and_refused() -> None:
    finished: list[str] = []

    async def suspends() -> None:
        try:
            await asyncio.sleep(0)
        finally:
            finished.append("closed")

    with pytest.raises(RuntimeError, match="suspended"):
        run_to_end(suspends())
    assert finished == ["closed"]
