"""SPEC §4 through the adapters: what crosses to a model, against the real plane."""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path

import warden
from tests.adapters.cases import CONCEALMENT, FAILURES, case, normalised
from tests.adapters.conftest import actor_for, mcp_wire, through_both_adapters
from tests.conftest import Plant
from warden.adapters import openai as warden_openai

ADAPTERS = Path(warden.__file__).resolve().parent / "adapters"


def test_si8_adapters_conceal_unknown_unexposed_and_hidden_identically(
    adapter_rt: warden.Runtime, lab_plant: Plant
) -> None:
    token = lab_plant.token()
    calls = [(case(name).capability, {"n": 1}, token) for name in CONCEALMENT]
    answers = through_both_adapters(adapter_rt, calls)
    for adapter, texts in answers.items():
        assert len(set(texts)) == 1, f"{adapter} tells the three cases apart"
    (content,) = set(answers["openai"])
    assert json.loads(content) == {
        "code": "CAPABILITY_NOT_FOUND",
        "message": "Capability not found.",
        "retryable": False,
    }
    (line,) = set(answers["mcp"])
    error = json.loads(line)["error"]
    assert (error["code"], error["message"]) == (-32602, "Unknown tool")
    assert error["data"] == json.loads(content)
    # The audit log records the truth, for each adapter's surface.
    rows = lab_plant.rows(
        "SELECT surface, reason FROM audit_events WHERE code = 'CAPABILITY_NOT_FOUND' ORDER BY seq"
    )
    reasons = ["unknown-capability", "unexposed-surface", "hidden-by-policy:lab-hide"]
    assert [(r["surface"], r["reason"]) for r in rows] == [
        *[("openai", r) for r in reasons],
        *[("mcp", r) for r in reasons],
    ]


def test_si8_adapters_answer_a_name_that_cannot_be_a_capability_as_unknown(
    adapter_rt: warden.Runtime, lab_plant: Plant
) -> None:
    """An empty or over-long tool name is an unknown tool, not 'try again later'."""
    token = lab_plant.token()
    calls = [(name, {"n": 1}, token) for name in ("", "orders." + "x" * 300)]
    answers = through_both_adapters(adapter_rt, calls)
    for content in answers["openai"]:
        assert json.loads(content)["code"] == "CAPABILITY_NOT_FOUND"
    for line in answers["mcp"]:
        error = json.loads(line)["error"]
        assert (error["code"], error["message"]) == (-32602, "Unknown tool")


def test_si8_adapters_offer_neither_hidden_nor_unexposed_tools(
    adapter_rt: warden.Runtime, lab_plant: Plant
) -> None:
    token = lab_plant.token()
    offered = {
        warden_openai.capability_id(t["function"]["name"])
        for t in warden_openai.tools(adapter_rt, actor=token)
    }

    async def mcp_tools() -> set[str]:
        async with mcp_wire(adapter_rt, actor=token) as wire:
            return {t.name for t in (await wire.session.list_tools()).tools}

    listed = asyncio.run(mcp_tools())
    for capability in ("orders.secret", "orders.direct_only", "orders.nope"):
        assert capability not in offered and capability not in listed
    assert "orders.mcp_only" in listed and "orders.mcp_only" not in offered


def test_si9_adapters_answer_every_failure_in_one_of_two_shapes_byte_for_byte(
    adapter_rt: warden.Runtime, lab_plant: Plant
) -> None:
    calls = [
        (c.capability, c.arguments, actor_for(lab_plant, c)) for c in FAILURES for _ in range(2)
    ]
    answers = through_both_adapters(adapter_rt, calls)
    exposed = {"code", "message", "retryable"}
    concealed = {"code": "INTERNAL_ERROR", "message": "The operation failed."}
    for adapter, texts in answers.items():
        for index, failure in enumerate(FAILURES):
            first, second = texts[2 * index], texts[2 * index + 1]
            message = json.loads(first)
            shape = message if adapter == "openai" else _mcp_shape(message)
            if failure.model_code == "INTERNAL_ERROR":
                assert shape == concealed
            else:
                assert exposed <= set(shape) <= exposed | {"details"}
            # The same error, the same bytes (a suspension names its own approval).
            assert normalised(first, shape) == normalised(second, _shape_of(adapter, second))


def _mcp_shape(message: dict[str, object]) -> dict[str, object]:
    if "error" in message:
        return message["error"]["data"]  # type: ignore[index, no-any-return]
    return message["result"]["structuredContent"]  # type: ignore[index, no-any-return]


def _shape_of(adapter: str, text: str) -> dict[str, object]:
    message = json.loads(text)
    return message if adapter == "openai" else _mcp_shape(message)


def test_si10_adapters_never_carry_causes_stacks_or_policy_internals(
    adapter_rt: warden.Runtime, lab_plant: Plant
) -> None:
    token = lab_plant.token()
    calls = [
        ("orders.echo", {"n": 1, "note": "explode"}, token),
        ("orders.echo", {"n": 1, "note": "lie"}, token),
        ("orders.echo", {"n": 13}, token),
        ("orders.secret", {"n": 1}, token),
        ("orders.echo", {"n": 1}, "not-a-jwt"),
    ]
    answers = through_both_adapters(adapter_rt, calls)
    private = [
        "hunter2",
        "db.internal",
        "RuntimeError",
        "Traceback",
        "not a number",
        "lab-broken",
        "divide",
        "lab-hide",
        "hidden",
        "rejected",
    ]
    for adapter, texts in answers.items():
        for text in texts:
            for word in private:
                assert word not in text, f"{adapter} let {word!r} out: {text}"
    # The private body exists: the audit log has it.
    causes = " ".join(
        f"{r['cause_message']} {r['stack']} {r['reason']} {r['rules']}" for r in lab_plant.rows()
    )
    for word in ("hunter2", "Traceback", "lab-broken", "lab-hide", "rejected"):
        assert word in causes


def test_si10_adapters_read_only_the_public_face() -> None:
    """The adapters' source never touches a cause, a stage, the private parts
    of an error or the unstripped output, and never unwraps."""
    forbidden = {
        "cause",
        "stage",
        "public_message",
        "expose_to_model",
        "details",
        "output",
        "unwrap",
        "__cause__",
        "__traceback__",
    }
    sources = sorted(ADAPTERS.glob("*.py"))
    assert {p.name for p in sources} >= {"openai.py", "mcp.py", "_translate.py"}
    for path in sources:
        tree = ast.parse(path.read_text(), filename=str(path))
        names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert not names & forbidden, f"{path.name} reads {sorted(names & forbidden)}"


def test_si5_adapters_strip_model_hidden_fields(
    adapter_rt: warden.Runtime, lab_plant: Plant
) -> None:
    answers = through_both_adapters(adapter_rt, [("orders.profile", {"n": 3}, lab_plant.token())])
    (content,) = answers["openai"]
    assert json.loads(content) == {"n": 3}
    (line,) = answers["mcp"]
    result = json.loads(line)["result"]
    assert result["structuredContent"] == {"n": 3}
    assert "ledger" not in line
    # The handler did return the field: the plane recorded it (it is not sensitive).
    outputs = [r["output"] for r in lab_plant.rows() if r["kind"] == "outcome"]
    assert outputs and all("ledger-3-internal" in o for o in outputs)


def test_a_limited_call_reaches_the_model_as_its_public_face_alone(
    adapter_rt: warden.Runtime, lab_plant: Plant
) -> None:
    acme, globex = lab_plant.token(tenant="acme"), lab_plant.token(tenant="globex")
    arguments = {"n": 1, "note": "limited"}
    calls = [("orders.echo", arguments, globex), ("orders.echo", arguments, acme)] * 2
    answers = through_both_adapters(adapter_rt, calls)
    # The first call of each tenant spends its token (function calling goes first).
    first, _, globex_again, acme_again = answers["openai"]
    assert json.loads(first) == {"n": 1, "note": "limited"}
    faces = [json.loads(c) for c in (globex_again, acme_again)]
    faces += [json.loads(line)["result"]["structuredContent"] for line in answers["mcp"]]
    for face in faces:
        assert set(face) == {"code", "message", "retryable", "details"}
        assert face["code"] == "RATE_LIMITED"
        assert face["message"] == "One limited note an hour; wait and try again."
        assert face["retryable"] is True
        assert set(face["details"]) == {"retry_after_ms"}
    for text in [*answers["openai"], *answers["mcp"]]:
        assert "globex" not in text and "acme" not in text
