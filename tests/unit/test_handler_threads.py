"""The threads that run synchronous handlers (``warden._handlers``)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from collections.abc import Iterator

import pytest

from warden._handlers import HandlerThreads


@pytest.fixture
def threads() -> Iterator[HandlerThreads]:
    pool = HandlerThreads(4, name="handlers-under-test")
    yield pool
    pool.shutdown()


def _ours(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name)]


def test_every_call_of_a_crowd_is_answered_with_its_own_result(threads: HandlerThreads) -> None:
    async def crowd() -> list[int]:
        return await asyncio.gather(*(threads.run(lambda n=n: n * n) for n in range(500)))

    assert asyncio.run(crowd()) == [n * n for n in range(500)]
    assert 1 <= len(_ours("handlers-under-test")) <= 4


def test_a_call_runs_on_another_thread_than_the_loop(threads: HandlerThreads) -> None:
    async def where() -> tuple[int, int]:
        return threading.get_ident(), await threads.run(threading.get_ident)

    loop_thread, handler_thread = asyncio.run(where())
    assert handler_thread != loop_thread


def test_what_a_call_raises_reaches_its_caller(threads: HandlerThreads) -> None:
    def fails() -> None:
        raise KeyError("missing")

    async def call() -> None:
        await threads.run(fails)

    with pytest.raises(KeyError, match="missing"):
        asyncio.run(call())


def test_a_call_raising_stop_iteration_fails_with_runtime_error(threads: HandlerThreads) -> None:
    def stops() -> None:
        raise StopIteration

    async def call() -> None:
        await threads.run(stops)

    with pytest.raises(RuntimeError, match="StopIteration"):
        asyncio.run(call())


def test_a_call_whose_caller_stopped_waiting_before_it_started_never_runs() -> None:
    pool = HandlerThreads(1)
    release = threading.Event()
    ran: list[str] = []

    async def scenario() -> None:
        busy = pool.run(release.wait)  # holds the only thread
        waiting = pool.run(lambda: ran.append("late"))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await waiting
        release.set()
        await busy
        await pool.run(lambda: ran.append("next"))

    try:
        asyncio.run(scenario())
    finally:
        pool.shutdown()
    assert ran == ["next"]


def test_each_loop_hears_its_own_calls(threads: HandlerThreads) -> None:
    answers: dict[str, list[int]] = {}

    def on_a_loop_of_its_own(name: str) -> None:
        async def calls() -> list[int]:
            return await asyncio.gather(*(threads.run(lambda n=n: n) for n in range(100)))

        answers[name] = asyncio.run(calls())

    runners = [threading.Thread(target=on_a_loop_of_its_own, args=(n,)) for n in "ab"]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join(timeout=30)
    assert answers == {"a": list(range(100)), "b": list(range(100))}


def test_shutdown_cancels_calls_not_started_and_refuses_new_ones() -> None:
    pool = HandlerThreads(1, name="handlers-shut-down")
    release = threading.Event()

    async def scenario() -> None:
        busy = pool.run(release.wait)
        queued = pool.run(lambda: "never")
        await asyncio.sleep(0.01)
        pool.shutdown()
        release.set()
        assert await busy is True
        with pytest.raises(asyncio.CancelledError):
            await queued
        with pytest.raises(RuntimeError, match="shut down"):
            pool.run(lambda: None)

    asyncio.run(scenario())
    deadline = time.monotonic() + 5
    while _ours("handlers-shut-down"):
        assert time.monotonic() < deadline, "a handler thread outlived shutdown"
        time.sleep(0.01)


def test_a_loop_that_ended_is_let_go(threads: HandlerThreads) -> None:
    """A caller may run each call in a loop of its own (``asyncio.run``):
    the threads keep none of them."""
    ended: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def one_call() -> int:
        ended.append(weakref.ref(asyncio.get_running_loop()))
        return await threads.run(lambda: 7)

    assert [asyncio.run(one_call()) for _ in range(3)] == [7, 7, 7]
    gc.collect()
    assert [loop() for loop in ended] == [None, None, None]


def test_a_blocking_caller_gets_the_result_or_what_the_call_raised(
    threads: HandlerThreads,
) -> None:
    caller = threading.get_ident()
    assert threads.call(threading.get_ident, timeout_s=5) != caller
    with pytest.raises(KeyError, match="gone"):
        threads.call(lambda: {}["gone"], timeout_s=5)
    with pytest.raises(TimeoutError, match="its own"):  # the call's own, not the budget's

        def late() -> None:
            raise TimeoutError("its own")

        threads.call(late, timeout_s=5)


def test_a_blocking_caller_stops_waiting_at_its_budget_and_a_call_not_started_never_runs() -> None:
    pool = HandlerThreads(1)
    release = threading.Event()
    ran: list[str] = []
    try:
        with pytest.raises(TimeoutError, match=r"ran past its 0\.05 s"):
            pool.call(release.wait, timeout_s=0.05)  # holds the only thread
        with pytest.raises(TimeoutError):
            pool.call(lambda: ran.append("late"), timeout_s=0.05)
        release.set()
        assert pool.call(lambda: ran.append("next"), timeout_s=5) is None
    finally:
        pool.shutdown()
    assert ran == ["next"]
