"""No outcome is lost across a restart of the plane: grants outlive it (the
grant key persists beside the store), a report is taken whenever it arrives,
and a report repeated because its answer was lost is never recorded twice."""

from __future__ import annotations

import stat
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.lab import Lab, build_lab, write_lab_policies
from tests.integration.test_rpc_input import (
    ORDERS,
    Stubs,
    assert_chain_intact,
    begin_grant,
    complete_request,
    invocation_state,
    open_stubs,
)


def lab_plane(start_plane: Callable[..., Plant], tmp_path: Path) -> Plant:
    """A lab plane with the lab capabilities registered (by a runtime closed since)."""
    plant = start_plane(write_lab_policies(tmp_path / "lab-policies"))
    rt = build_lab(plant.target, ORDERS_TOKEN, Lab())
    try:
        rt.register()
    finally:
        rt.close()
    return plant


def test_a_report_after_a_restart_is_taken_with_the_default_grant_key(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    before = lab_plane(start_plane, tmp_path)
    with open_stubs(before) as stubs:
        invocation_id, token = begin_grant(stubs, before)
    before.server.stop(grace=0)

    after = start_plane(write_lab_policies(tmp_path / "lab-policies"))  # the same store
    with open_stubs(after) as stubs:
        response = stubs.governor.Complete(
            complete_request(invocation_id, token), metadata=ORDERS, timeout=10
        )
    (row,) = after.events(kind="outcome")
    assert (row["seq"], row["invocation_id"]) == (response.audit_seq, invocation_id)
    assert invocation_state(after, invocation_id) == "completed"
    key_file = tmp_path / "warden.db.grant-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert_chain_intact(after)


def test_a_repeated_report_is_answered_with_the_record_of_the_first(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    plant = lab_plane(start_plane, tmp_path)
    with open_stubs(plant) as stubs:
        invocation_id, token = begin_grant(stubs, plant)
        request = complete_request(invocation_id, token)
        first = stubs.governor.Complete(request, metadata=ORDERS, timeout=10)
        again = stubs.governor.Complete(request, metadata=ORDERS, timeout=10)
    assert again.audit_seq == first.audit_seq
    (row,) = plant.events(kind="outcome")
    assert row["seq"] == first.audit_seq
    assert_chain_intact(plant)


def test_one_report_sent_many_times_at_once_is_recorded_once(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    """Which report completes an invocation is decided in the store's write, so
    copies racing through several connections (several plane processes, when
    the plane serves with them) all get the one record."""
    plant = lab_plane(start_plane, tmp_path)
    with open_stubs(plant) as stubs:
        invocation_id, token = begin_grant(stubs, plant)
    request = complete_request(invocation_id, token)
    answers: list[int] = []
    lock = threading.Lock()

    def report() -> None:
        channel = grpc.insecure_channel(
            plant.target, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        try:
            seq = Stubs(channel).governor.Complete(request, metadata=ORDERS, timeout=10).audit_seq
        finally:
            channel.close()
        with lock:
            answers.append(seq)

    threads = [threading.Thread(target=report) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (row,) = plant.events(kind="outcome")
    assert answers == [row["seq"]] * 12
    assert_chain_intact(plant)
