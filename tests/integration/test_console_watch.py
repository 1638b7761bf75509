"""The console's approval watch ends quietly when its page goes away first."""

from __future__ import annotations

import threading

from tests.conftest import Plant
from warden_server.console.plane import Plane as ConsolePlane


def test_a_watch_stopped_before_it_began_ends_without_an_error(lab_plant: Plant) -> None:
    """Sign-out or shutdown can stop a watch before its RPC starts: the watch
    then closes its channel at once, and must not go on to call through it."""
    plane = ConsolePlane(lab_plant.target)
    token = lab_plant.token(sub="mia", roles=("manager",))
    for _ in range(20):  # the closing thread and the watch race: give it every chance
        stop = threading.Event()
        stop.set()
        assert list(plane.watch(token, stop, include_pending=True)) == []


def test_a_watch_stopped_while_watching_ends_without_an_error(lab_plant: Plant) -> None:
    plane = ConsolePlane(lab_plant.target)
    token = lab_plant.token(sub="mia", roles=("manager",))
    stop = threading.Event()
    ended = threading.Event()
    failures: list[BaseException] = []

    def watch() -> None:
        try:
            list(plane.watch(token, stop))
        except BaseException as exc:  # reported below, not lost in the thread
            failures.append(exc)
        finally:
            ended.set()

    threading.Thread(target=watch, daemon=True).start()
    stop.set()
    assert ended.wait(10), "the watch did not end when stopped"
    assert failures == []
