"""How a served plane is asked to stop: by a signal's handler or by any
thread, and answered by the main thread (``Server.wait(until=...)``).

A signal's handler runs on the main thread between two of its bytecodes,
wherever it is: inside ``Future.result``, say, holding the lock that the
event loop's thread takes to answer that future. A handler that stopped the
plane itself would wait for that thread, which waits for the lock, and
neither would move again: a plane deaf to SIGTERM for good. So a handler
records the request and returns; the main thread stops the plane.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable


class StopRequest:
    """Whether, and why, the plane was asked to stop. Only attribute writes,
    no locks: safe from a signal's handler and from any thread."""

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        self.reason: str | None = None
        """Why, as said first: e.g. "received SIGTERM"."""
        self._say = say

    def handle(self, signum: int, _frame: object) -> None:
        """The handler of the signals that stop a plane: records the request,
        and says so when given a way to (``say``)."""
        received = f"received {signal.Signals(signum).name}"
        self.make(received)
        if self._say is not None:
            with contextlib.suppress(RuntimeError):  # the main thread was writing there itself
                self._say(f"{received}, stopping")

    def make(self, reason: str) -> None:
        """Ask the plane to stop (the first reason is kept)."""
        if self.reason is None:
            self.reason = reason

    def made(self) -> bool:
        return self.reason is not None
