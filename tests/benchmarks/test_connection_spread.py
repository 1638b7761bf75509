"""``serving_processes`` finds the processes of a tree that serve a port and
counts the connections each has accepted: the split the peers benchmark
prints beside each point, with each one's CPU (``process_seconds``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from benchmarks.peers.cpu import process_seconds, serving_processes, tree_seconds

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

        serving = serving_processes(os.getpid(), port)
        assert [(each.pid, each.connections) for each in serving] == [
            (child.pid, 3),
            (os.getpid(), 1),
        ]
        # The client ends (local port: their own) are not counted, nor is another port.
        assert serving_processes(os.getpid(), port + 1 if port < 65535 else 1) == []


def test_a_listening_process_with_nothing_accepted_counts_zero(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port)):
        serving = serving_processes(os.getpid(), port)
        assert [(each.pid, each.connections) for each in serving] == [(os.getpid(), 0)]


def test_a_process_cpu_is_its_own_not_its_childrens() -> None:
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", busy + "\ninput()"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while process_seconds(child.pid) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        spent = process_seconds(child.pid)  # idle from here on, waiting for its input
        assert spent >= 0.3
        # The child's time counts in the tree, not in this process's own
        # (read first: this process keeps running between the two reads).
        own = process_seconds(os.getpid())
        assert round(tree_seconds(os.getpid()) - own, 2) >= spent  # in clock ticks
    finally:
        child.communicate(b"\n", timeout=10)
