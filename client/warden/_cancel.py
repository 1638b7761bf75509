"""Cancelling a running invocation from any thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CancelToken:
    """Cancels the invocations it is passed to (``invoke(..., cancel=token)``).

    ``cancel()`` may be called from any thread, before or during the call. The
    invocation then returns an envelope with status ``cancelled`` (code
    ``CANCELLED``): before the grant, the handler never runs; while it runs,
    an async handler is cancelled and a synchronous one is abandoned to finish
    in its thread, and the envelope says ``executed_before_failure``. Async
    callers may equally cancel the task that awaits ``ainvoke``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._tasks: set[tuple[asyncio.AbstractEventLoop, asyncio.Task[object]]] = set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Cancel every invocation running with this token, and those started later."""
        with self._lock:
            self._cancelled = True
            bound = list(self._tasks)
        for loop, task in bound:
            loop.call_soon_threadsafe(self._cancel_if_bound, loop, task)

    def _cancel_if_bound(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[object]) -> None:
        # Runs on the task's loop, as does unbinding: a call that has already
        # ended is never cancelled, so its caller's task is left alone.
        with self._lock:
            if (loop, task) in self._tasks:
                task.cancel()

    @contextmanager
    def bound_to_current_task(self) -> Iterator[None]:
        """Make ``cancel`` reach the running task while the block runs (a
        cancellation from before is for the block to check: ``cancelled``)."""
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - always called inside a task
            yield
            return
        entry = (asyncio.get_running_loop(), task)
        with self._lock:
            self._tasks.add(entry)
        try:
            yield
        finally:
            with self._lock:
                self._tasks.discard(entry)
