"""``connections_by_process`` counts, for each process of a tree, the
connections to a port that process has accepted: the split the peers
benchmark prints beside each point."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from benchmarks.peers.cpu import connections_by_process

# A child that accepts ``n`` connections on the inherited listening socket,
# says so, and holds them until its standard input closes.
CHILD = """
import socket, sys
listener = socket.socket(fileno=int(sys.argv[1]))
held = [listener.accept()[0] for _ in range(int(sys.argv[2]))]
print("accepted", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


def test_each_process_counts_the_connections_it_accepted(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    with ExitStack() as stack:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(listener.fileno()), "3"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=[listener.fileno()],
        )
        stack.callback(child.wait, 10)
        stack.callback(child.stdin.close)  # type: ignore[union-attr]
        clients = [stack.enter_context(socket.create_connection(("127.0.0.1", port)))]
        clients += [stack.enter_context(socket.create_connection(("127.0.0.1", port)))]
        clients += [stack.enter_context(socket.create_connection(("127.0.0.1", port)))]
        assert child.stdout is not None and child.stdout.readline().strip() == "accepted"
        # One more, accepted here, in the tree's root; and one never accepted,
        # which no process holds yet.
        clients.append(stack.enter_context(socket.create_connection(("127.0.0.1", port))))
        mine, _ = listener.accept()
        stack.enter_context(mine)
        clients.append(stack.enter_context(socket.create_connection(("127.0.0.1", port))))

        assert connections_by_process(os.getpid(), port) == [3, 1]
        # The client ends (local port: their own) are not counted, nor is another port.
        assert connections_by_process(os.getpid(), port + 1 if port < 65535 else 1) == []


def test_a_process_with_nothing_accepted_is_left_out(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port)):
        assert connections_by_process(os.getpid(), port) == []
