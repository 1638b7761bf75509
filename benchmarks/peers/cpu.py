"""CPU time of a server: its process and every descendant, read from /proc.

A server may fork workers (``--processes``), so its cost is the sum over the
tree. Read twice, around the measured window, the difference divided by the
window is the cores the server used to serve that load.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def tree_seconds(pid: int) -> float:
    """user + system CPU seconds of ``pid`` and all its live descendants."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        total += _own_seconds(current)
        pending.extend(_children(current))
    return total


def _own_seconds(pid: int) -> float:
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
