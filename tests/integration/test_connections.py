"""The runtime's connections to a plane that is slow to take them.

A plane busy enough (a loaded machine, a large policy set being loaded
beside it) can take a few hundred milliseconds to answer a new connection.
The runtime waits for it within the governance timeout, as for any answer,
rather than fail the call as though no plane were there.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.conftest import ORDERS_TOKEN, Plant

ANSWER_DELAY_S = 0.5


class SlowDoor:
    """A TCP relay to a plane that lets each new connection through only after
    ``delay_s``, as a busy plane answers it late."""

    def __init__(self, upstream: tuple[str, int], delay_s: float) -> None:
        self._upstream = upstream
        self._delay_s = delay_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = [self._listener]
        self.target = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            self._sockets.append(client)
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        time.sleep(self._delay_s)
        try:
            plane = socket.create_connection(self._upstream)
        except OSError:
            client.close()
            return
        self._sockets.append(plane)
        threading.Thread(target=_pipe, args=(client, plane), daemon=True).start()
        _pipe(plane, client)

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65_536):
            sink.sendall(data)
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def slow_door(plant: Plant) -> Iterator[SlowDoor]:
    door = SlowDoor(("127.0.0.1", plant.server.port), ANSWER_DELAY_S)
    yield door
    door.close()


def test_a_plane_slow_to_answer_a_new_connection_is_waited_for(
    plant: Plant, slow_door: SlowDoor, orders_example: ModuleType
) -> None:
    rt = orders_example.build_runtime(slow_door.target, ORDERS_TOKEN)
    try:
        started = time.monotonic()
        rt.register()
        assert time.monotonic() - started >= ANSWER_DELAY_S, "the relay did not hold it back"
        envelope = rt.invoke("orders.get", {"order_id": "A1"}, actor=plant.token())
        assert envelope.status == "succeeded", envelope.error
        assert rt.flush(timeout_ms=10_000) == 0
    finally:
        rt.close()
    assert len(plant.events(kind="outcome", invocation_id=envelope.invocation_id)) == 1
