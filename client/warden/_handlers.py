"""The threads that run synchronous handlers, off the runtime's event loop.

A synchronous handler blocks, so it runs on a thread of its own while the
event loop goes on with the other calls. ``loop.run_in_executor`` would do
it with a ``concurrent.futures`` future per call (a lock and a condition
made, callbacks chained both ways) and a write to the loop's wake-up pipe
for every result. Here a finished handler's result joins its loop's list
of answers, and only the first answer since the loop last looked wakes it:
under load, one wake-up hands over many results. With 500 concurrent
callers the runtime's CPU per call went from 623-661 to 521-583 µs
(``docs/performance.md``, item 32). A caller that blocks anyway (``invoke``
from a thread) waits on a ``concurrent.futures`` future of its own (``call``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, Final

_STOP: Final = None

_Work = tuple[Callable[[], Any], "_Answers | _Direct", Any]
"""A call, where its answer goes, and the future it settles (the loop's, or a
``concurrent.futures`` one for ``_Direct``)."""
_Answer = tuple["asyncio.Future[Any]", Any, BaseException | None, bool]
"""A future, and its result, its exception, or whether it is cancelled."""


class HandlerThreads:
    """Up to ``max_threads`` threads that run calls for coroutines.

    A thread is started when a call finds none idle, up to the limit; the
    threads are daemons and live until ``shutdown``.
    """

    def __init__(self, max_threads: int, name: str = "warden-handler") -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self._max_threads = max_threads
        self._name = name
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._answers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Answers] = (
            weakref.WeakKeyDictionary()
        )

    def run(self, call: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run ``call`` on one of the threads; its result (or exception) on a
        future of the running loop. Cancelling the future before a thread
        takes the call means it never runs.

        Raises:
            RuntimeError: the threads were shut down.
        """
        loop = asyncio.get_running_loop()
        answers = self._answers.get(loop)
        if answers is None:
            answers = self._answers.setdefault(loop, _Answers(loop))
        future: asyncio.Future[Any] = loop.create_future()
        self._submit((call, answers, future))
        return future

    def call(self, call: Callable[[], Any], timeout_s: float | None) -> Any:
        """Run ``call`` on one of the threads and wait for its result (or
        exception) at most ``timeout_s``; a call no thread took by then never runs.

        Raises:
            TimeoutError: ``timeout_s`` passed first.
            RuntimeError: the threads were shut down.
        """
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._submit((call, _DIRECT, future))
        try:
            return future.result(timeout_s)
        except TimeoutError:
            if future.done():  # the call's own
                raise
            future.cancel()
            raise TimeoutError(f"the call ran past its {timeout_s} s") from None

    def _submit(self, work: _Work) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the handler threads were shut down")
            self._work.put(work)
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_threads:
                thread = threading.Thread(
                    target=self._serve, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def shutdown(self) -> None:
        """Stop the threads once they finish what they run; calls not started
        yet are cancelled."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = len(self._threads)
        while True:
            try:
                work = self._work.get_nowait()
            except queue.Empty:
                break
            if work is not None:
                _, answers, future = work
                answers.cancel(future)
        for _ in range(threads):
            self._work.put(_STOP)

    def _serve(self) -> None:
        while (work := self._work.get()) is not _STOP:
            _run(*work)
            del work  # nothing of it kept alive while this thread idles
            self._idle.release()


def _run(call: Callable[[], Any], answers: _Answers | _Direct, future: Any) -> None:
    if not answers.start(future):  # its caller stopped waiting before it started
        return
    try:
        result = call()
    except StopIteration as exc:  # a future cannot carry one (asyncio's rule)
        failure = RuntimeError("the handler raised StopIteration")
        failure.__cause__ = exc
        answers.fail(future, failure)
    except BaseException as exc:  # handed to the caller, like run_in_executor
        answers.fail(future, exc)
    else:
        answers.succeed(future, result)


class _Direct:
    """Results for callers that wait on a ``concurrent.futures`` future of their own."""

    def start(self, future: concurrent.futures.Future[Any]) -> bool:
        return future.set_running_or_notify_cancel()

    def succeed(self, future: concurrent.futures.Future[Any], result: Any) -> None:
        future.set_result(result)

    def fail(self, future: concurrent.futures.Future[Any], exc: BaseException) -> None:
        future.set_exception(exc)

    def cancel(self, future: concurrent.futures.Future[Any]) -> None:
        future.cancel()


_DIRECT: Final = _Direct()


class _Answers:
    """Results for the futures of one event loop, handed over in batches."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: a loop that ends (``asyncio.run`` per call, say) is let go,
        # and with it its entry among the threads' answers.
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._ready: list[_Answer] = []
        self._woken = False
        """The loop will look at ``_ready``: further answers need not wake it."""

    def start(self, future: asyncio.Future[Any]) -> bool:
        return not future.cancelled()

    def succeed(self, future: asyncio.Future[Any], result: Any) -> None:
        self._hand_over((future, result, None, False))

    def fail(self, future: asyncio.Future[Any], exc: BaseException) -> None:
        self._hand_over((future, None, exc, False))

    def cancel(self, future: asyncio.Future[Any]) -> None:
        self._hand_over((future, None, None, True))

    def _hand_over(self, answer: _Answer) -> None:
        with self._lock:
            self._ready.append(answer)
            wake = not self._woken
            self._woken = True
        loop = self._loop()
        if wake and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
            self._woken = False
        for future, result, exc, cancelled in ready:
            if future.done():  # cancelled meanwhile: nobody waits for it
                continue
            if cancelled:
                future.cancel()
            elif exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)
