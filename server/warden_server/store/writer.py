"""What the two stores' writer threads share: the work they are handed, the
queue they take it from in batches, and how a committed batch is answered.

Callers hand a store's writer thread pieces of work (``QueuedWork``) through a
``WorkQueue``; the writer takes everything waiting as one batch, runs it in
one transaction, and answers each piece of work once the batch is committed
(``answer``). How a batch runs and commits is each store's own.

A served SQLite store commits from the server's event loop instead
(``LoopCommits``): the requests that loop answers hand it their work without
a thread between them, and a batch is whatever came while the loop was busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any, Generic, TypeVar

from warden_server.records.events import AuditEvent
from warden_server.store.base import StoreError, StoreObserver

log = logging.getLogger(__name__)

Tx = TypeVar("Tx")


class QueuedWork(Generic[Tx]):
    """A piece of work for the writer, and its caller waiting to hear how it went."""

    __slots__ = ("context", "deadline", "work")

    def __init__(self, work: Callable[[Tx], Any], deadline: float | None) -> None:
        self.work = work
        self.deadline = deadline
        # The work runs on the writer thread but in its caller's context, so
        # what it reads from there (the current trace, for a record it builds)
        # is the caller's.
        self.context = contextvars.copy_context()

    def settle(self, result: Any, failure: BaseException | None) -> None:
        """Tell the caller what the work returned, or what it raised (or why
        it never ran). A caller that stopped waiting is not told: the other
        work of its batch is still answered."""
        raise NotImplementedError


class Job(QueuedWork[Tx]):
    """Work a thread waits for, on ``future``."""

    __slots__ = ("future",)

    def __init__(self, work: Callable[[Tx], Any], deadline: float | None) -> None:
        super().__init__(work, deadline)
        self.future: Future[Any] = Future()

    def settle(self, result: Any, failure: BaseException | None) -> None:
        try:
            if failure is None:
                self.future.set_result(result)
            else:
                self.future.set_exception(failure)
        except InvalidStateError:  # cancelled: nobody waits for it
            pass


class AwaitedJob(QueuedWork[Tx]):
    """Work a coroutine awaits on its event loop (``awaited``).

    Settled on that loop's thread (as ``LoopCommits`` commits), the loop's
    own future is set there and then; from another thread (a writer thread),
    the loop is asked to set it.
    """

    __slots__ = ("_loop", "_thread", "waiter")

    def __init__(
        self, work: Callable[[Tx], Any], deadline: float | None, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(work, deadline)
        self._loop = loop
        self._thread = threading.get_ident()
        self.waiter: asyncio.Future[Any] = loop.create_future()

    def settle(self, result: Any, failure: BaseException | None) -> None:
        if threading.get_ident() == self._thread:
            _set(self.waiter, result, failure)
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
            self._loop.call_soon_threadsafe(_set, self.waiter, result, failure)


def _set(waiter: asyncio.Future[Any], result: Any, failure: BaseException | None) -> None:
    if waiter.done():  # cancelled: nobody waits for it
        return
    if failure is None:
        waiter.set_result(result)
    else:
        waiter.set_exception(failure)


Outcome = tuple[QueuedWork[Any], Any, BaseException | None]
"""A piece of work, and what it returned or raised."""
Ran = tuple[list[Outcome], list[AuditEvent]]
"""What a batch's pieces of work came to, and the audit records they appended."""

_STOP = object()
_HANDOVER = object()


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
        self.handed_over = False
        """The handover marker was taken: another writer takes it from here."""
        self.on_put: Callable[[], None] | None = None
        """Called after each ``put``: how a writer that does not wait on the
        queue (``LoopCommits``) hears of work."""

    def put(self, jobs: Sequence[QueuedWork[Any]]) -> None:
        """Queue work for the writer.

        Raises:
            StoreError: the queue was stopped (work put after the stop marker
                would never be answered).
        """
        with self._lock:
            if self._stopped:
                raise StoreError("the store is closed")
            self._queue.put(jobs)
            on_put = self.on_put
        if on_put is not None:
            on_put()

    def hand_over(self) -> None:
        """End the waiting writer's turn once it has run what was put before."""
        self._queue.put(_HANDOVER)

    def stop(self) -> None:
        """Let the writer finish what was put before, then end; refuse what comes after."""
        with self._lock:
            self._stopped = True
            self._queue.put(_STOP)

    def qsize(self) -> int:
        return self._queue.qsize()

    def next_batch(self) -> list[QueuedWork[Any]] | None:
        """Wait for work, then take everything waiting; None once stopped or
        handed over."""
        if self.stopping or self.handed_over:
            return None
        batch: list[QueuedWork[Any]] = []
        while not batch:
            if not self._take(batch, self._queue.get()):
                return None
        self.take_waiting(batch)
        return batch

    def take_waiting(self, batch: list[QueuedWork[Any]]) -> None:
        """Add the work waiting in the queue to ``batch``, up to ``max_batch``."""
        while len(batch) < self._max_batch and not self.stopping:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if not self._take(batch, item):
                return

    def _take(self, batch: list[QueuedWork[Any]], item: Any) -> bool:
        """Add a group of jobs to ``batch``; False for a marker, which ends the turn."""
        if item is _STOP:
            self.stopping = True
            return False
        if item is _HANDOVER:
            self.handed_over = True
            return False
        batch.extend(item)
        return True


async def awaited(queue: WorkQueue, work: Callable[[Tx], Any], deadline: float | None) -> Any:
    """Queue one piece of work and wait for its answer without blocking the loop."""
    job: AwaitedJob[Tx] = AwaitedJob(work, deadline, asyncio.get_running_loop())
    queue.put([job])
    return await job.waiter


class LoopCommits:
    """Commits a store's batches on an event loop's thread, once the loop has
    caught up with its requests.

    A coroutine's work arrives between two of the loop's turns. Committing at
    once would commit it alone, while the requests the gRPC server has not yet
    handed to the loop wait behind the commit; so the commit waits until
    ``IDLE_TURNS`` turns of the loop bring no more work, or ``GATHER_SECONDS``
    since the first work waiting, whichever comes first. With one request at a
    time that costs a few microseconds; under load a batch holds what the
    loop's requests wrote in the meantime, for one commit and one fsync.

    While another process has its turn at the store, a thread waits for it
    and the loop goes on answering requests: their work joins the batch.

    A batch that took in nothing besides its first piece of work (one
    ``put``) says the loop's requests come one at a time: the next commits
    at once, without the idle turns, until a batch has company again. At
    one call in flight that takes the turns' 50-60 µs off every ``Begin``;
    under load the wait resumes after each lone batch (10-23% of the batches
    under the ``peers`` load), with throughput and p99 unchanged over twelve
    pairs of runs (``docs/performance.md``, item 50).

    ``GATHER_SECONDS`` bounds how long a record waits for company when the
    loop never catches up. It is longer than the loop takes to run the stages
    of the 16 or so calls a process has in flight under load: at 5 ms, a
    process cut half its batches short while some of its calls were still in
    their stages, and those calls waited for the batch after (p99 at 32 in
    flight 20 against 15 ms at 8 ms; ``docs/performance.md``, item 48).
    """

    IDLE_TURNS = 20
    GATHER_SECONDS = 0.008

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        queue: WorkQueue,
        *,
        try_turn: Callable[[], bool],
        take_turn: Callable[[], None],
        commit: Callable[[list[QueuedWork[Any]]], None],
    ) -> None:
        """``try_turn`` takes the writers' lock if it is free, ``take_turn``
        waits for it; ``commit`` runs a batch in that turn and ends it."""
        self._loop = loop
        self._queue = queue
        self._try_turn = try_turn
        self._take_turn = take_turn
        self._commit = commit
        self._arrivals = 0
        self._first_arrival = 0
        """``_arrivals`` when the work waiting now began to arrive."""
        self._alone = False
        """The last batch came of one arrival: the next does not wait for company."""
        self._waiting_since: float | None = None
        self._turn_awaited = False
        self._finished = False
        self.thread_id: int | None = None
        """The loop's thread, once known: where a blocking wait would never end."""

    def start(self) -> None:
        """Take over from a writer thread that has handed over: commit what is waiting."""
        self._queue.on_put = self._heard
        self._loop.call_soon_threadsafe(self._arrived)

    def _heard(self) -> None:
        if threading.get_ident() == self.thread_id:
            self._arrived()
        else:
            self._loop.call_soon_threadsafe(self._arrived)

    def _arrived(self) -> None:
        self.thread_id = threading.get_ident()
        self._arrivals += 1
        if self._waiting_since is None:
            self._waiting_since = self._loop.time()
            self._first_arrival = self._arrivals
            self._loop.call_soon(self._caught_up, self._arrivals, 0)

    def _caught_up(self, seen: int, idle: int) -> None:
        assert self._waiting_since is not None
        if self._loop.time() - self._waiting_since >= self.GATHER_SECONDS:
            self._run()
        elif self._arrivals != seen:
            self._loop.call_soon(self._caught_up, self._arrivals, 0)
        elif idle < (0 if self._alone else self.IDLE_TURNS):
            self._loop.call_soon(self._caught_up, seen, idle + 1)
        else:
            self._run()

    def _run(self) -> None:
        if self._finished or self._turn_awaited:
            return
        if self._try_turn():
            self._commit_waiting()
            return
        self._turn_awaited = True
        waited = self._loop.run_in_executor(None, self._take_turn)
        waited.add_done_callback(self._turn_taken)

    def _turn_taken(self, waited: asyncio.Future[None]) -> None:
        self._turn_awaited = False
        if self._finished:
            return
        if waited.exception() is not None:
            log.error("waiting for the store's turn failed", exc_info=waited.exception())
        self._commit_waiting()

    def _commit_waiting(self) -> None:
        self._alone = self._arrivals == self._first_arrival
        self._waiting_since = None
        batch: list[QueuedWork[Any]] = []
        self._queue.take_waiting(batch)
        self._commit(batch)
        if self._queue.qsize():
            self._arrived()

    def finish(self, close: Callable[[], None]) -> None:
        """Commit what is waiting, then ``close``; on the loop's thread while it
        runs, else here (nothing commits from the loop any more)."""

        def last() -> None:
            self._finished = True
            self._queue.on_put = None
            while True:
                batch: list[QueuedWork[Any]] = []
                self._take_turn()
                self._queue.take_waiting(batch)
                self._commit(batch)
                if not batch:
                    break
            close()

        if self._loop.is_closed() or not self._loop.is_running():
            last()
            return
        if threading.get_ident() == self.thread_id:
            last()
            return
        done: Future[None] = Future()

        def run_last() -> None:
            try:
                last()
            except BaseException as exc:
                done.set_exception(exc)
            else:
                done.set_result(None)

        try:
            self._loop.call_soon_threadsafe(run_last)
        except RuntimeError:  # the loop closed meanwhile
            last()
            return
        done.result()


def answer(
    ran: Ran, batch: Sequence[QueuedWork[Any]], observer: StoreObserver | None, seconds: float
) -> None:
    """Answer each piece of work of a committed batch, after telling the observer."""
    outcomes, events = ran
    if observer is not None:
        try:
            observer.committed(len(batch), events, seconds)
        except Exception:
            log.exception("the store observer failed; the batch is committed")
    for job, result, failure in outcomes:
        job.settle(result, failure)


def refuse(batch: Sequence[QueuedWork[Any]], error: BaseException) -> None:
    """Answer every piece of work of a batch that could not commit."""
    for job in batch:
        job.settle(None, error)
