"""CPU time of a server: its process and every descendant, read from /proc.

A server may fork workers (``--processes``), so its cost is the sum over the
tree. Read twice, around the measured window, the difference divided by the
window is the cores the server used to serve that load; read for each
process serving the port, how that load fell on them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def tree_seconds(pid: int) -> float:
    """user + system CPU seconds of ``pid`` and all its live descendants."""
    return sum(process_seconds(each) for each in _tree(pid))


def _tree(pid: int) -> Iterator[int]:
    """``pid`` and its live descendants."""
    pending = [pid]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(_children(current))


def process_seconds(pid: int) -> float:
    """user + system CPU seconds of ``pid`` alone (every thread, no children)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0  # it exited in the meantime
    # The command name (field 2) may hold spaces; the fields after it don't.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / _TICKS


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found.extend(int(child) for child in children.read_text().split())
        except OSError:
            continue
    return found


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores), from /proc/stat.

    Over a window, busy cores minus the server's and the generator's are what
    everything else took: a figure measured on a busy machine says so.
    """
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _TICKS


@dataclass(frozen=True)
class Serving:
    """One process of a server's tree that serves a port."""

    pid: int
    connections: int
    """The established connections to the port this process has accepted."""


def serving_processes(pid: int, port: int) -> list[Serving]:
    """The processes of ``pid``'s tree that listen on ``port`` or hold
    connections accepted from it, busiest first.

    Processes sharing a port (SO_REUSEPORT) each get the connections the
    kernel's hash sends them, once per connection: a split such as 14 and 2
    halves one process's load and doubles the other's queue, which moves a
    point's throughput and p99 more than most changes to the server. Read
    beside each point, with each process's CPU, so a reader can tell luck
    from cost. A process that listens but was sent nothing counts zero.
    """
    listening, accepted = _sockets_on(port)
    found: list[Serving] = []
    for current in _tree(pid):
        inodes = _socket_inodes(current)
        held = sum(1 for inode in inodes if inode in accepted)
        if held or any(inode in listening for inode in inodes):
            found.append(Serving(current, held))
    return sorted(found, key=lambda serving: serving.connections, reverse=True)


_ESTABLISHED = "01"
_LISTENING = "0A"


def _sockets_on(port: int) -> tuple[set[str], set[str]]:
    """Inodes of the TCP sockets whose local port is ``port``: listening, and established."""
    listening: set[str] = set()
    established: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if int(local.rsplit(":", 1)[1], 16) != port:
                continue
            if state == _ESTABLISHED:
                established.add(inode)
            elif state == _LISTENING:
                listening.add(inode)
    return listening, established


def _socket_inodes(pid: int) -> list[str]:
    found: list[str] = []
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found  # it exited in the meantime
    for descriptor in descriptors:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.append(target[8:-1])
    return found
