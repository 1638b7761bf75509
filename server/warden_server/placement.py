"""Where the plane's processes run: with one process per CPU, one CPU each.

A serving process has several threads that take turns at one interpreter:
the event loop, gRPC's poller (which takes the interpreter for every
completion it hands to the loop) and the pool. Left to the kernel, they
migrate between cores and hand the interpreter across them, each time
without the other core's caches. Pinned, a process's threads share one
core, and the processes of a plane no longer meet on one core while another
idles. Measured with two processes on two cores, 32 ``Begin`` in flight:
5 to 14% more throughput, depending on the load generator's driver, and a
lower p99 (``docs/performance.md``, item 21).

Only ``warden serve`` pins, and only when the plane has one process per CPU
it may use (``[server] pin_processes``): a plane embedded in a program, or one
given fewer processes than CPUs, leaves placement to the kernel.
"""

from __future__ import annotations

import contextlib
import logging
import os

log = logging.getLogger(__name__)


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity: a container's CPU set,
    not the whole machine), in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpus_for(processes: int, *, pin: bool) -> list[int] | None:
    """The CPU for each of ``processes`` (the first process's first), or None
    to leave them where the kernel puts them: when pinning is off, when
    there is a single process, or when processes and CPUs are not one to one."""
    if not pin or processes < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = usable_cpus()
    return cpus if len(cpus) == processes else None


def pin_to(cpu: int) -> None:
    """Run this process on ``cpu``: every thread it has now, and so every
    thread those start (a new thread inherits its starter's affinity).

    A CPU the process may no longer use (its CPU set changed since it was
    counted) leaves it where the kernel puts it, and says so.
    """
    try:
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(task), {cpu})
    except OSError as exc:
        log.warning("cannot run on CPU %d (%s): the kernel places this process", cpu, exc)
