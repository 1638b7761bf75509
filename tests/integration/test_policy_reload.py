"""Hot reload under load (SI-12): a policy set is swapped whole, a broken set
never takes effect, every decision records the revision it used, and the
audit log shows every load and every refusal."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner

from tests.conftest import ORDERS_TOKEN, Plant, make_config
from tests.integration.lab import Lab, build_lab
from warden.v1 import registry_pb2, registry_pb2_grpc
from warden_server.app import serve
from warden_server.audit.chain import verify_rows
from warden_server.cli import main
from warden_server.config import PoliciesSection
from warden_server.plane import Plane
from warden_server.policy.loader import read_policy_folder

# These tests read the plane's own memory (its spans, metrics, reloader and
# policy holder), which a second process would not share.
pytestmark = pytest.mark.single_process

SET_A = """
rules:
  - id: allow-all
    capabilities: ["orders.*"]
    effect: allow
  - id: limit
    capabilities: ["orders.echo"]
    effect: deny
    when: input.n > 100
    message: "A: use at most 100."
"""
SET_B = SET_A.replace("input.n > 100", "input.n > 50").replace(
    "A: use at most 100.", "B: use at most 50."
)
# Broken as a whole: its first rule is valid and would deny everything if any
# part of the set ever took effect.
BROKEN = """
rules:
  - id: deny-everything
    capabilities: ["orders.*"]
    effect: deny
    message: "BROKEN"
  - id: syntax-error
    capabilities: ["orders.*"]
    effect: deny
    when: input.n >
"""
NUMBERS = (10, 75, 150)


def write_atomically(path: Path, text: str) -> None:
    """Replace a file the way editors and deploy tools do: write aside, rename."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def expected_outcome(revision_set: str, n: int) -> tuple[str, str | None]:
    limit, message = (
        (100, "A: use at most 100.") if revision_set == "A" else (50, "B: use at most 50.")
    )
    return ("failed", message) if n > limit else ("succeeded", None)


def test_si12_hot_reload_swaps_whole_sets_under_concurrent_decisions(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    folder = tmp_path / "live"
    folder.mkdir()
    (folder / "rules.yaml").write_text(SET_A)
    revision_a = read_policy_folder(folder).revision
    plant = start_plane(folder, policy_debounce_ms=50)
    rt = build_lab(plant.target, ORDERS_TOKEN, Lab())
    rt.register()
    actor = plant.token()
    results: list[tuple[str, int, str, str | None]] = []
    lock = threading.Lock()
    stop = threading.Event()
    failures: list[BaseException] = []

    def caller(offset: int) -> None:
        i = offset
        try:
            while not stop.is_set():
                n = NUMBERS[i % len(NUMBERS)]
                env = rt.invoke("orders.echo", {"n": n}, actor=actor)
                message = env.error.public_message if env.error else None
                with lock:
                    results.append((env.invocation_id, n, env.status, message))
                i += 1
        except BaseException as exc:  # surfaced below: a thread's failure fails the test
            failures.append(exc)

    def decided() -> int:
        with lock:
            return len(results)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: decided() >= 30, "decisions under set A")
        write_atomically(folder / "rules.yaml", SET_B)
        revision_b = read_policy_folder(folder).revision
        wait_for(
            lambda: plant.events(kind="policy", status="loaded", policy_revision=revision_b),
            "set B to load",
        )
        settled = decided()
        wait_for(lambda: decided() >= settled + 30, "decisions under set B")
        write_atomically(folder / "zz-broken.yaml", BROKEN)
        revision_broken = read_policy_folder(folder).revision
        wait_for(
            lambda: plant.events(kind="policy", status="rejected", policy_revision=revision_broken),
            "the broken set to be refused",
        )
        settled = decided()
        wait_for(lambda: decided() >= settled + 30, "decisions after the refusal")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        rt.close()
    assert failures == []

    rows = plant.rows()
    by_invocation = {r["invocation_id"]: r for r in rows if r["kind"] == "decision"}
    sets = {revision_a: "A", revision_b: "B"}
    seen = {"A": 0, "B": 0}
    for invocation_id, n, status, message in results:
        record = by_invocation[invocation_id]
        assert record["policy_revision"] in sets, "a decision used a set that was never loaded"
        which = sets[record["policy_revision"]]
        seen[which] += 1
        # The outcome is exactly what that whole set decides: nothing half-loaded.
        assert (status, message) == expected_outcome(which, n), (which, n, status, message)
        assert message != "BROKEN"
    assert seen["A"] >= 30 and seen["B"] >= 60

    policy_rows = [r for r in rows if r["kind"] == "policy"]
    assert [(r["status"], r["reason"], r["policy_revision"]) for r in policy_rows] == [
        ("loaded", "startup", revision_a),
        ("loaded", "reload", revision_b),
        ("rejected", "reload", revision_broken),
    ]
    loaded_b, rejected = policy_rows[1], policy_rows[2]
    assert json.loads(loaded_b["details"]) == {
        "files": ["rules.yaml"],
        "rules": 2,
        "previous_revision": revision_a,
        "evaluator": "cel-cpp",
    }
    assert json.loads(rejected["details"]) == {
        "files": ["rules.yaml", "zz-broken.yaml"],
        "problems": 1,
        "serving_revision": revision_b,
    }
    assert rejected["cause_message"] == (
        f"{folder}/zz-broken.yaml:10:19: rules[1].when: CEL syntax error: "
        "the expression ends too soon"
    )
    # The load was durable before any decision used it; after the refusal, B stays.
    first_b = min(r["seq"] for r in by_invocation.values() if r["policy_revision"] == revision_b)
    assert loaded_b["seq"] < first_b
    after = [r for r in by_invocation.values() if r["seq"] > rejected["seq"]]
    assert after and all(r["policy_revision"] == revision_b for r in after)
    assert verify_rows(rows).ok


def test_a_folder_back_to_the_set_in_force_settles_the_refusal(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    folder = tmp_path / "live"
    folder.mkdir()
    (folder / "rules.yaml").write_text(SET_A)
    plant = start_plane(folder, watch_policies=False)
    reloader, holder = plant.server.plane.reloader, plant.server.plane.policies
    assert reloader.reload() == "unchanged"
    write_atomically(folder / "zz-broken.yaml", BROKEN)
    assert reloader.reload() == "rejected"
    assert reloader.reload() == "unchanged", "the same refused change is recorded once"
    assert holder.status().rejected is not None
    (folder / "zz-broken.yaml").unlink()
    assert reloader.reload() == "unchanged"
    assert holder.status().rejected is None
    assert [r["status"] for r in plant.events(kind="policy")] == ["loaded", "rejected"]


def test_a_folder_replaced_whole_is_watched_from_then_on(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    """A deploy that swaps the folder in (``mv new live``) is loaded, and the
    edits after it too: the watch followed the old folder and heard no more."""
    folder = tmp_path / "live"
    folder.mkdir()
    (folder / "rules.yaml").write_text(SET_A)
    plant = start_plane(folder, policy_debounce_ms=50)
    holder = plant.server.plane.policies

    def moved_on(revision: str) -> bool:
        deadline = time.monotonic() + 20
        while holder.current().revision == revision:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    first = holder.current().revision
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "rules.yaml").write_text(SET_B)
    folder.rename(tmp_path / "old")
    staged.rename(folder)
    assert moved_on(first), "the folder swapped in was not loaded"
    second = holder.current().revision
    time.sleep(1.5)  # past a check of the folder's identity, which follows the new one
    write_atomically(folder / "rules.yaml", SET_A.replace("input.n > 100", "input.n > 70"))
    assert moved_on(second), "an edit to the new folder was not loaded"
    assert holder.status().rejected is None


def test_a_vanished_folder_keeps_the_last_good_set(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    folder = tmp_path / "live"
    folder.mkdir()
    (folder / "rules.yaml").write_text(SET_A)
    plant = start_plane(folder, watch_policies=False)
    before = plant.server.plane.policies.current()
    (folder / "rules.yaml").unlink()
    folder.rmdir()
    assert plant.server.plane.reloader.reload() == "rejected"
    assert plant.server.plane.policies.current() is before
    (row,) = plant.events(kind="policy", status="rejected")
    assert row["policy_revision"] is None
    assert row["cause_message"] == f"{folder}: no such policy folder"


# Each of these reads a field or variable the wrong way for its declared type
# (orders.echo's input is {n: integer, note: string}): every matching call
# would fail to evaluate, so the checker refuses the set.
ILL_TYPED = {
    'input.n > "500"': "no operator '>' for (int, string): input.n is an integer in orders.echo",
    "input.note > 500": "no operator '>' for (string, int): input.note is a string in orders.echo",
    "actor.roles > 5": "no operator '>' for (list(string), int): actor.roles is a list of strings",
    "size(input.n) > 1": "no function 'size' for (int): input.n is an integer in orders.echo",
    "1/0 == 1": "1/0 always fails: divide by zero",
    'matches(actor.id, "[")': '"[" is not a valid regular expression: missing ]: [',
    "actor.tenant": "'when' must be a bool, found string",
}


def test_si12_an_ill_typed_set_is_refused_on_reload_and_the_previous_set_serves(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    folder = tmp_path / "live"
    folder.mkdir()
    (folder / "rules.yaml").write_text(SET_A)
    plant = start_plane(folder, watch_policies=False)
    rt = build_lab(plant.target, ORDERS_TOKEN, Lab())
    rt.register()
    reloader, holder = plant.server.plane.reloader, plant.server.plane.policies
    before = holder.current()
    for when, message in ILL_TYPED.items():
        rule = (
            'rules:\n  - id: ill-typed\n    capabilities: ["orders.echo"]\n'
            f"    effect: deny\n    when: '{when}'\n"
        )
        write_atomically(folder / "zz-typed.yaml", rule)
        assert reloader.reload() == "rejected", when
        rejected = holder.status().rejected
        assert rejected is not None
        [problem] = rejected.problems
        assert (problem.file, problem.line) == (str(folder / "zz-typed.yaml"), 5), when
        assert problem.column > 1 or message.startswith("'when'"), when
        assert problem.message.startswith(message), (when, problem.message)
        assert holder.current() is before
    env = rt.invoke("orders.echo", {"n": 10}, actor=plant.token())
    assert env.status == "succeeded"
    statuses = [r["status"] for r in plant.events(kind="policy")]
    assert statuses == ["loaded"] + ["rejected"] * len(ILL_TYPED)


FAILING_TEST = """
tests:
  - name: a small number is refused
    capability: orders.echo
    input: {n: 10}
    expect: {effect: deny, rule: limit}
"""


def test_si12_a_set_whose_own_tests_fail_is_not_loaded_and_status_names_the_case(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    folder = tmp_path / "live"
    (folder / "tests").mkdir(parents=True)
    (folder / "rules.yaml").write_text(SET_A)
    plant = start_plane(folder, watch_policies=False)
    reloader, holder = plant.server.plane.reloader, plant.server.plane.policies
    before = holder.current()
    (folder / "tests" / "limits.yaml").write_text(FAILING_TEST)
    write_atomically(folder / "rules.yaml", SET_B)
    assert reloader.reload() == "rejected"
    assert holder.current() is before
    rejected = holder.status().rejected
    assert rejected is not None
    [problem] = rejected.problems
    assert (problem.file, problem.line) == (str(folder / "tests" / "limits.yaml"), 3)
    assert problem.message == (
        "test 'a small number is refused' fails: expected {'effect': 'deny', 'rule': 'limit'}, "
        "got {'effect': 'allow', 'rule': 'allow-all'}"
    )
    status = CliRunner().invoke(
        main,
        ["policy", "status", "--target", plant.target, "--token", plant.token(roles=("auditor",))],
    )
    assert status.exit_code == 1
    assert f"{folder}/tests/limits.yaml:3:1: test 'a small number is refused' fails" in (
        status.output
    )
    # Fixing the test alone lifts the refusal: the tests gate the set.
    assert reloader.reload() == "unchanged"
    write_atomically(
        folder / "tests" / "limits.yaml",
        FAILING_TEST.replace("{effect: deny, rule: limit}", "{effect: allow, rule: allow-all}"),
    )
    assert reloader.reload() == "loaded"
    assert holder.status().rejected is None
    assert holder.current() is not before


READS_ONLY = """
rules:
  - id: reads-are-free
    capabilities: ["orders.*"]
    effect: allow
    when: capability.side_effect == "read"
"""
READS_ONLY_TEST = """
tests:
  - name: echo reads, so it is allowed
    capability: orders.echo
    input: {n: 10}
    expect: {effect: allow, rule: reads-are-free}
"""


def test_the_gate_calls_a_capability_named_by_id_as_registered(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    """A case naming a capability by id is decided with the capability as the
    registry holds it (orders.echo reads), not with made-up facts: the set
    its case passes on the plane loads, and the decision agrees with it."""
    folder = tmp_path / "live"
    (folder / "tests").mkdir(parents=True)
    (folder / "rules.yaml").write_text(SET_A)
    plant = start_plane(folder, watch_policies=False)
    rt = build_lab(plant.target, ORDERS_TOKEN, Lab())
    rt.register()
    reloader, holder = plant.server.plane.reloader, plant.server.plane.policies
    (folder / "tests" / "reads.yaml").write_text(READS_ONLY_TEST)
    write_atomically(folder / "rules.yaml", READS_ONLY)
    assert reloader.reload() == "loaded", holder.status().rejected
    try:
        env = rt.invoke("orders.echo", {"n": 10}, actor=plant.token())
        assert env.status == "succeeded"
        assert rt.flush(timeout_ms=10_000) == 0
    finally:
        rt.close()


def test_a_set_whose_tests_fail_loads_when_the_gate_is_off(tmp_path: Path) -> None:
    folder = tmp_path / "live"
    (folder / "tests").mkdir(parents=True)
    (folder / "rules.yaml").write_text(SET_A)
    (folder / "tests" / "limits.yaml").write_text(FAILING_TEST)
    config = make_config(tmp_path, folder, watch_policies=False)
    config = config.model_copy(update={"policies": PoliciesSection(require_passing_tests=False)})
    running = serve(Plane.from_config(config), "127.0.0.1:0")
    try:
        write_atomically(folder / "rules.yaml", SET_B)
        assert running.plane.reloader.reload() == "loaded"
    finally:
        running.stop(grace=0)


def test_si12_rules_must_type_check_against_every_registered_version(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    """A caller pinned to an older version still reaches the rules: a field
    only the newest version declares is refused, naming the version without it."""
    folder = tmp_path / "live"
    folder.mkdir()
    (folder / "rules.yaml").write_text(SET_A)
    plant = start_plane(folder, watch_policies=False)
    rt = build_lab(plant.target, ORDERS_TOKEN, Lab())
    rt.register()
    first = rt.capabilities["orders.echo"].to_proto()
    schema = json.loads(first.input_schema_json)
    schema["properties"]["priority"] = {"type": "integer"}
    newer = registry_pb2.CapabilityDefinition()
    newer.CopyFrom(first)
    newer.version = ""
    newer.input_schema_json = json.dumps(schema)
    with grpc.insecure_channel(plant.target) as channel:
        (registered,) = (
            registry_pb2_grpc.RegistryStub(channel)
            .Register(
                registry_pb2.RegisterRequest(capabilities=[newer]),
                metadata=(("x-warden-service-token", ORDERS_TOKEN),),
                timeout=10,
            )
            .capabilities
        )
    assert registered.definition.version == "2"
    reloader, holder = plant.server.plane.reloader, plant.server.plane.policies
    before = holder.current()
    write_atomically(
        folder / "zz-priority.yaml",
        'rules:\n  - id: urgent\n    capabilities: ["orders.echo"]\n'
        "    effect: deny\n    when: 'input.priority > 3'\n",
    )
    assert reloader.reload() == "rejected"
    rejected = holder.status().rejected
    assert rejected is not None
    assert any(
        "has no field 'priority' in the input schema of orders.echo v1" in p.message
        for p in rejected.problems
    ), rejected.problems
    assert holder.current() is before
