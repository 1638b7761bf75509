"""One plane, two languages, one log: a TypeScript service and a Python service
share a running plane (issue: polyglot SDKs).

The billing service is written in TypeScript (client/typescript/test/e2e/),
the orders service in Python (examples/orders/). Each invokes its own
capabilities and the other's, the other's through that service's MCP server,
whose tools are the plane's discovery for the actor, as a model would. An
approval the TypeScript service asks for is decided with the Python CLI, and
the TypeScript service resumes. Every attempt lands in one audit log that
verifies, under the right service names.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from mcp import ClientSession, StdioServerParameters, stdio_client

import warden
from tests.adapters import unreadable
from tests.conftest import BILLING_TOKEN, EXAMPLE_POLICIES, ORDERS_TOKEN, Plant, load_example
from tests.integration import typescript
from warden_server.cli import main

ROOT = Path(__file__).resolve().parents[2]
BILLING_POLICY = """\
rules:
  - id: quotes-in-the-tenant
    capabilities: ["billing.quote"]
    effect: allow
    when: actor.tenant != ""
  - id: support-may-charge
    capabilities: ["billing.charge"]
    effect: allow
    when: '"support" in actor.roles'
  - id: big-charges-need-a-manager
    capabilities: ["billing.charge"]
    effect: require_approval
    when: input.amount > 100 && !("manager" in actor.roles)
    message: "Charges above $100 need a manager's approval."
    approvers: '"manager" in approver.roles'
    ttl: 1h
"""


@pytest.fixture(scope="session")
def compiled() -> Path:
    return typescript.build()


@pytest.fixture
def polyglot(start_plane: Callable[..., Plant], tmp_path: Path) -> Plant:
    policies = tmp_path / "policies"
    shutil.copytree(EXAMPLE_POLICIES, policies, ignore=shutil.ignore_patterns("tests"))
    (policies / "billing.yaml").write_text(BILLING_POLICY)
    return start_plane(policies)


@pytest.fixture
def orders_rt(polyglot: Plant) -> Iterator[warden.Runtime]:
    rt = load_example("orders").build_runtime(polyglot.target, ORDERS_TOKEN)
    rt.register()
    yield rt
    rt.close()


def node_env(plant: Plant, actor: str) -> dict[str, str]:
    return {
        **os.environ,
        "WARDEN_TARGET": plant.target,
        "WARDEN_SERVICE_TOKEN": BILLING_TOKEN,
        "WARDEN_SERVICE_ORDERS_TOKEN": ORDERS_TOKEN,
        "WARDEN_ACTOR_TOKEN": actor,
        "WARDEN_PYTHON": sys.executable,
        "ORDERS_MCP_SERVER": str(ROOT / "examples" / "orders" / "mcp_server.py"),
    }


class Driver:
    """The TypeScript driver process: one JSON line per step, answers on stdin."""

    def __init__(self, compiled: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            ["node", str(compiled / "e2e" / "driver.js")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def step(self, name: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=30)
            assert self.process.stderr is not None
            raise AssertionError(f"the driver ended before {name}: {self.process.stderr.read()}")
        answer: dict[str, Any] = json.loads(line)
        assert answer["step"] == name, answer
        return answer

    def tell(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def call_billing_over_mcp(compiled: Path, env: dict[str, str]) -> tuple[list[str], Any]:
    """Python as a model's host: list the TypeScript service's tools and call one."""
    parameters = StdioServerParameters(
        command="node", args=[str(compiled / "e2e" / "billing-mcp.js")], env=env
    )

    async def scenario() -> tuple[list[str], Any]:
        async with stdio_client(parameters) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = sorted(t.name for t in (await session.list_tools()).tools)
            return names, await session.call_tool("billing.quote", {"amount": 500})

    return anyio.run(scenario)


def test_the_typescript_mcp_server_answers_a_line_that_is_not_a_message_as_python_does(
    compiled: Path, polyglot: Plant
) -> None:
    found = unreadable.answers(
        ["node", str(compiled / "e2e" / "billing-mcp.js")],
        node_env(polyglot, polyglot.token()),
        "billing.quote",
        '{"amount":500}',
    )
    # JavaScript's parser reads the lone surrogate escape (Python's MCP SDK
    # does not): that call reaches the plane, which refuses the input.
    assert unreadable.unreadable(found) == [unreadable.EXPECTED[0], unreadable.EXPECTED[2]]
    (odd,) = [a for a in found if a.get("id") == 1]
    assert odd["result"]["isError"] is True
    assert odd["result"]["structuredContent"]["code"] == "INPUT_INVALID"
    assert found[-1]["result"]["isError"] is False, found[-1]


def approve(plant: Plant, approval_id: str) -> None:
    manager = plant.token(sub="mia", roles=("manager",))
    done = CliRunner().invoke(
        main,
        ["approvals", "approve", approval_id, "--target", plant.target, "--token", manager],
        catch_exceptions=False,
    )
    assert done.exit_code == 0, done.output


def test_one_plane_two_languages_one_log(
    compiled: Path, polyglot: Plant, orders_rt: warden.Runtime
) -> None:
    actor = polyglot.token()
    env = node_env(polyglot, actor)

    own_python = orders_rt.invoke("orders.get", {"order_id": "A1"}, actor=actor)
    assert own_python.status == "succeeded"

    driver = Driver(compiled, env)
    try:
        own_ts = driver.step("own")
        assert (own_ts["status"], own_ts["output"]) == ("succeeded", {"amount": 40, "fee": 1})

        suspended = driver.step("suspended")
        assert suspended["status"] == "suspended"
        assert suspended["model"]["code"] == "APPROVAL_REQUIRED"
        assert suspended["model"]["message"] == "Charges above $100 need a manager's approval."
        approve(polyglot, suspended["approval_id"])
        driver.tell("approved")
        resumed = driver.step("resumed")
        assert resumed["status"] == "succeeded"
        assert resumed["output"] == {"charge_id": "ch-250", "processor_ref": "psp-42"}
        assert resumed["model_output"] == {"charge_id": "ch-250"}  # model-hidden stripped

        other_ts = driver.step("other")  # TypeScript calls the Python service's tool
        assert other_ts["tools"] == ["orders.get", "orders.refund"]
        assert other_ts["result"] == {"order_id": "A1", "total": 1250, "refundable": True}

        si7 = driver.step("si7")
        assert si7["registered"] is False and si7["refused"] is True
        assert "PERMISSION_DENIED" in si7["message"]
    finally:
        driver.close()

    tools, quoted = call_billing_over_mcp(compiled, env)  # Python calls the TypeScript tool
    assert tools == ["billing.charge", "billing.quote"]
    assert quoted.is_error is False
    assert quoted.structured_content == {"amount": 500, "fee": 10}

    rows = polyglot.rows()
    services = {
        (r["capability_id"], r["service"])
        for r in rows
        if r["kind"] in ("decision", "outcome") and r["capability_id"]
    }
    assert services == {
        ("orders.get", "orders"),
        ("billing.quote", "billing"),
        ("billing.charge", "billing"),
    }

    # Every attempt is in the log: decided, and its outcome reported (a suspension has none).
    def kinds(invocation: dict[str, Any]) -> list[str]:
        found = [r["kind"] for r in rows if r["invocation_id"] == invocation["invocation_id"]]
        return sorted(k for k in found if k in ("decision", "outcome"))

    assert kinds(own_ts) == kinds(resumed) == ["decision", "outcome"]
    assert kinds(suspended) == ["decision"]
    quotes = [r for r in rows if r["capability_id"] == "billing.quote" and r["kind"] == "outcome"]
    assert {r["surface"] for r in quotes} == {"direct", "mcp"}
    gets = [r for r in rows if r["capability_id"] == "orders.get" and r["kind"] == "outcome"]
    assert {r["surface"] for r in gets} == {"direct", "mcp"}
    charges = [r for r in rows if r["capability_id"] == "billing.charge"]
    assert all("4111111111111111" not in json.dumps(r) for r in charges)  # SI-5
    approval_kinds = [r["status"] for r in rows if r["kind"] == "approval"]
    assert "approved" in approval_kinds and "consumed" in approval_kinds
    # SI-7: nothing registered, and the attempt is on the record.
    sneaks = [
        (r["kind"], r["status"], r["service"]) for r in rows if r["capability_id"] == "orders.sneak"
    ]
    assert sneaks == [("registry", "refused", "billing")]

    verified = CliRunner().invoke(
        main, ["audit", "verify", "--store", str(polyglot.db_path)], catch_exceptions=False
    )
    assert verified.exit_code == 0, verified.output


ALL_BILLING = """\
rules:
  - id: billing-in-the-tenant
    capabilities: ["billing.*"]
    effect: allow
    when: actor.tenant != ""
"""


def test_the_typescript_runtime_keeps_its_guarantees_on_a_real_plane(
    compiled: Path, start_plane: Callable[..., Plant], policy_dir: Callable[[str], Path]
) -> None:
    """client/typescript/test/plane/runtime.test.ts: declared and concealed errors,
    output validation, time budgets, AbortSignal, Standard Schema input, idempotency,
    offline grant verification, failing closed with honest retries, SI-7."""
    plant = start_plane(policy_dir(ALL_BILLING))
    done = run_plane_tests(compiled, plant)
    assert "# fail 0" in done.stdout and "# pass 22" in done.stdout
    # SI-5: the card quoted in the handler's exception is masked in the private body too.
    (exploded,) = plant.events(kind="outcome", capability_id="billing.explode")
    assert exploded["cause_message"] == "the table payments is locked for card [REDACTED]"
    assert "4111111111111111" not in json.dumps(plant.rows())


def run_plane_tests(
    compiled: Path, plant: Plant, *options: str
) -> subprocess.CompletedProcess[str]:
    """client/typescript/test/plane/runtime.test.ts against ``plant``; they must pass."""
    done = subprocess.run(
        ["node", "--test", *options, str(compiled / "plane" / "runtime.test.js")],
        env=node_env(plant, plant.token()),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


TOGETHER = 100
"""Calls the TypeScript test of reports sent together makes at once (``TOGETHER`` there)."""


@pytest.mark.single_process  # counts the report calls one process's metrics saw
def test_typescript_reports_due_together_are_sent_in_few_calls_and_each_is_recorded(
    compiled: Path, start_plane: Callable[..., Plant], policy_dir: Callable[[str], Path]
) -> None:
    plant = start_plane(policy_dir(ALL_BILLING))
    done = run_plane_tests(compiled, plant, "--test-name-pattern=reports sent together")
    assert "# pass 1\n" in done.stdout
    outcomes = plant.events(kind="outcome", capability_id="billing.look")
    assert [o["status"] for o in outcomes] == ["succeeded"] * TOGETHER
    assert plant.rpc_calls("warden.v1.Governor/Complete") == 0
    assert 1 <= plant.rpc_calls("warden.v1.Governor/CompleteMany") < TOGETHER
