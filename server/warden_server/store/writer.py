"""What the two stores' writer threads share: the work they are handed, the
queue they take it from in batches, and how a committed batch is answered.

Callers hand a store's writer thread pieces of work (``Job``) through a
``WorkQueue``; the writer takes everything waiting as one batch, runs it in
one transaction, and answers each piece of work once the batch is committed
(``answer``). How a batch runs and commits is each store's own.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from warden_server.records.events import AuditEvent
from warden_server.store.base import StoreError, StoreObserver

log = logging.getLogger(__name__)

Tx = TypeVar("Tx")


class Job(Generic[Tx]):
    """A piece of work for the writer, and the future its caller waits on."""

    __slots__ = ("context", "deadline", "future", "work")

    def __init__(self, work: Callable[[Tx], Any], deadline: float | None) -> None:
        self.work = work
        self.deadline = deadline
        self.future: Future[Any] = Future()
        # The work runs on the writer thread but in its caller's context, so
        # what it reads from there (the current trace, for a record it builds)
        # is the caller's.
        self.context = contextvars.copy_context()


Outcome = tuple[Job[Any], Any, BaseException | None]
"""A piece of work, and what it returned or raised."""
Ran = tuple[list[Outcome], list[AuditEvent]]
"""What a batch's pieces of work came to, and the audit records they appended."""

_STOP = object()


class WorkQueue:
    """A writer's queue: groups of jobs never split between batches (a batch
    may pass ``max_batch`` by one such group), then the stop marker."""

    def __init__(self, max_batch: int) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._stopped = False
        self.stopping = False
        """The stop marker was taken: the batch being run is the last."""

    def put(self, jobs: list[Job[Any]]) -> None:
        """Queue work for the writer.

        Raises:
            StoreError: the queue was stopped (work put after the stop marker
                would never be answered).
        """
        with self._lock:
            if self._stopped:
                raise StoreError("the store is closed")
            self._queue.put(jobs)

    def stop(self) -> None:
        """Let the writer finish what was put before, then end; refuse what comes after."""
        with self._lock:
            self._stopped = True
            self._queue.put(_STOP)

    def qsize(self) -> int:
        return self._queue.qsize()

    def next_batch(self) -> list[Job[Any]] | None:
        """Wait for work, then take everything waiting; None once stopped."""
        if self.stopping:
            return None
        first = self._queue.get()
        if first is _STOP:
            self.stopping = True
            return None
        batch: list[Job[Any]] = list(first)
        self.take_waiting(batch)
        return batch

    def take_waiting(self, batch: list[Job[Any]]) -> None:
        """Add the work waiting in the queue to ``batch``, up to ``max_batch``."""
        while len(batch) < self._max_batch and not self.stopping:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is _STOP:
                self.stopping = True
            else:
                batch.extend(item)


def answer(
    ran: Ran, batch: Sequence[Job[Any]], observer: StoreObserver | None, seconds: float
) -> None:
    """Answer each piece of work of a committed batch, after telling the observer."""
    outcomes, events = ran
    if observer is not None:
        try:
            observer.committed(len(batch), events, seconds)
        except Exception:
            log.exception("the store observer failed; the batch is committed")
    for job, result, failure in outcomes:
        if failure is None:
            job.future.set_result(result)
        else:
            job.future.set_exception(failure)


def refuse(batch: Sequence[Job[Any]], error: BaseException) -> None:
    """Answer every piece of work of a batch that could not commit."""
    for job in batch:
        job.future.set_exception(error)
