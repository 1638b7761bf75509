"""Which of a runtime's connections a call takes: where it is expected to be
answered soonest (recent latency times calls in flight), in turn among equals.

The kernel hands a service's connections to a plane's processes unevenly; a
call dealt out in turn would queue at the busiest process while another idled.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from warden import _transport
from warden._transport import _Pool, _Stubs


def with_pool(check: Callable[[_Pool[_Stubs]], None]) -> None:
    """Run ``check`` on a pool of a running loop (nothing is ever connected)."""

    async def main() -> None:
        pool = _transport._aio_pool("127.0.0.1:9", None)
        try:
            check(pool)
        finally:
            await pool.close()

    asyncio.run(main())


def stubs_of(pool: _Pool[_Stubs]) -> list[_Stubs]:
    return [pool.next(now=0.0) for _ in range(_transport.CONNECTIONS)]


def test_connections_nothing_is_known_of_are_taken_in_turn() -> None:
    def check(pool: _Pool[_Stubs]) -> None:
        chosen = [id(pool.next(now=0.0)) for _ in range(4 * _transport.CONNECTIONS)]
        assert set(Counter(chosen).values()) == {4}

    with_pool(check)


def test_a_call_goes_where_answers_come_back_soonest() -> None:
    def check(pool: _Pool[_Stubs]) -> None:
        slow, fast, *others = stubs_of(pool)
        for stubs in (slow, *others):
            stubs.answered(0.800, now=10.0)
            stubs.in_flight = 100
        fast.answered(0.040, now=10.0)
        fast.in_flight = 100
        assert all(pool.next(now=10.0) is fast for _ in range(8))

    with_pool(check)


def test_calls_in_flight_count_so_the_fastest_connection_is_not_flooded() -> None:
    def check(pool: _Pool[_Stubs]) -> None:
        a, b, *others = stubs_of(pool)
        for stubs in (a, b, *others):
            stubs.answered(0.100, now=10.0)
        a.in_flight, b.in_flight = 0, 5
        for stubs in others:
            stubs.in_flight = 5
        assert all(pool.next(now=10.0) is a for _ in range(8))
        a.in_flight = 6
        assert all(pool.next(now=10.0) is not a for _ in range(8))

    with_pool(check)


def test_a_slow_answer_counts_at_once_and_a_fast_one_is_averaged_in() -> None:
    def check(pool: _Pool[_Stubs]) -> None:
        stubs = pool.next(now=0.0)
        stubs.answered(0.010, now=1.0)
        stubs.answered(0.500, now=1.001)
        assert 0.49 < stubs.latency_s(1.001) <= 0.5
        stubs.answered(0.010, now=1.002)
        assert stubs.latency_s(1.002) > 0.4

    with_pool(check)


def test_a_connection_left_aside_is_tried_again_as_its_latency_fades() -> None:
    def check(pool: _Pool[_Stubs]) -> None:
        slow, *others = stubs_of(pool)
        slow.answered(2.0, now=10.0)
        for stubs in others:
            stubs.answered(0.050, now=10.0)
            stubs.in_flight = 3
        assert pool.next(now=10.0) is not slow
        later = 10.0 + 12 * _transport.LATENCY_DECAY_S
        for stubs in others:
            stubs.answered(0.050, now=later)
        assert pool.next(now=later) is slow

    with_pool(check)


def test_a_connection_that_never_answers_does_not_draw_every_call() -> None:
    """Without an answer its latency is unknown, but the calls it holds count."""

    def check(pool: _Pool[_Stubs]) -> None:
        silent, *others = stubs_of(pool)
        silent.in_flight = 50
        for stubs in others:
            stubs.answered(0.002, now=10.0)
        assert all(pool.next(now=10.0) is not silent for _ in range(8))

    with_pool(check)


def test_connections_to_one_process_count_its_calls_together() -> None:
    """Every connection but one on one process, with 30 calls in flight between
    them, and the last alone on another: the lone one takes calls until its
    process carries as many as the other."""

    def check(pool: _Pool[_Stubs]) -> None:
        *crowded, lone = stubs_of(pool)
        for i, stubs in enumerate(crowded):
            stubs.process, stubs.in_flight = "a", 10 if i < 3 else 0
            stubs.answered(0.100, now=10.0)
        lone.process, lone.in_flight = "b", 10
        lone.answered(0.100, now=10.0)
        assert all(pool.next(now=10.0) is lone for _ in range(8))
        lone.in_flight = 29
        assert pool.next(now=10.0) is lone
        lone.in_flight = 31
        assert all(pool.next(now=10.0) in crowded for _ in range(8))

    with_pool(check)


def test_a_connection_left_aside_does_not_make_its_busy_process_look_fast() -> None:
    """Six connections on a process whose answers take a second, one of them
    left aside long enough to fade, and two on a process answering in 0.3 s
    with a third of the calls: the next call goes to the faster process."""

    def check(pool: _Pool[_Stubs]) -> None:
        *crowded, left_aside, fast_a, fast_b = stubs_of(pool)
        for stubs in crowded:
            stubs.process, stubs.in_flight = "slow", 60
            stubs.answered(1.0, now=10.0)
        left_aside.process, left_aside.in_flight = "slow", 0
        left_aside.answered(1.0, now=0.0)
        for stubs in (fast_a, fast_b):
            stubs.process, stubs.in_flight = "fast", 50
            stubs.answered(0.3, now=10.0)
        assert left_aside.latency_s(10.0) < 0.01
        assert all(pool.next(now=10.0) in (fast_a, fast_b) for _ in range(8))

    with_pool(check)
