"""The glob checker, the rule index, one activation per decision, and CEL syntax messages."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from warden_server.auth.actors import Actor
from warden_server.auth.services import Service
from warden_server.pipeline.context import BeginContext, BeginRequest
from warden_server.pipeline.policy import policy
from warden_server.pipeline.visibility import visibility
from warden_server.policy.cel import Activation, CelPythonEvaluator
from warden_server.policy.globs import CAPABILITY_ID, GlobIndex, can_match_an_id, matches
from warden_server.policy.loader import load_policies
from warden_server.registry import Capability, CapabilityDefinition

SEGMENT = st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True)
IDS = st.lists(SEGMENT, min_size=2, max_size=4).map(".".join)
GLOB_CHARS = st.sampled_from(list("ab.*?_0"))
GLOBS = st.lists(GLOB_CHARS, min_size=1, max_size=8).map("".join)


@given(IDS, st.data())
def test_a_glob_made_from_a_valid_id_can_match_one(capability_id: str, data: st.DataObject) -> None:
    chars = list(capability_id)
    for i in data.draw(st.sets(st.integers(0, len(chars) - 1))):
        chars[i] = data.draw(st.sampled_from(["*", "?"]))
    assert can_match_an_id("".join(chars))


def _short_ids() -> list[str]:
    """Every valid id of at most six characters over a tiny alphabet."""
    found, layer = [], [""]
    for _ in range(6):
        layer = [c + x for c in layer for x in "ab0_."]
        found += [c for c in layer if CAPABILITY_ID.match(c)]
    return found


SHORT_IDS = _short_ids()


@given(st.lists(GLOB_CHARS, min_size=1, max_size=6).map("".join))
def test_can_match_an_id_agrees_with_brute_force(glob: str) -> None:
    """Without a star a glob matches only ids of its own length, all of which
    are tried; with one, a short match proves the answer must be yes."""
    short_match = any(fnmatch.fnmatchcase(c, glob) for c in SHORT_IDS)
    if "*" not in glob:
        assert can_match_an_id(glob) == short_match
    elif short_match:
        assert can_match_an_id(glob)


@given(GLOBS, IDS)
def test_matches_answers_as_fnmatch(glob: str, cid: str) -> None:
    """Literal and ``prefix*`` globs are compared as text: the same answers."""
    assert matches(cid, glob) == fnmatch.fnmatchcase(cid, glob)
    literal = glob.replace("*", "").replace("?", "")
    for shaped in (literal, cid, cid[:3] + "*", literal + "*", cid + "*"):
        assert matches(cid, shaped) == fnmatch.fnmatchcase(cid, shaped), shaped


def test_globs_that_match_no_id() -> None:
    for glob in ("Orders.get", "orders", "orders..get", ".orders", "9x.y", "orders.get.", "x.9"):
        assert not can_match_an_id(glob), glob
    for glob in ("*", "orders.*", "*.get", "o?ders.get", "a.b.c", "*.*.*"):
        assert can_match_an_id(glob), glob


@given(st.lists(st.lists(GLOBS, min_size=1, max_size=3), max_size=12), IDS)
def test_the_index_answers_like_a_scan_of_every_glob(globs: list[list[str]], cid: str) -> None:
    index = GlobIndex(globs)
    expected = tuple(
        i for i, item in enumerate(globs) if any(fnmatch.fnmatchcase(cid, g) for g in item)
    )
    assert index.positions(cid) == expected
    assert index.positions(cid) == expected  # memoized answer is the same


def test_a_decision_evaluates_only_the_rules_for_its_capability(tmp_path: Path) -> None:
    lines = ["rules:"]
    for n in range(50):
        lines += [f"  - id: rule-{n}", f'    capabilities: ["ns{n}.*"]', "    effect: allow"]
    lines += [
        "  - id: everywhere",
        '    capabilities: ["*"]',
        "    effect: deny",
        "    when: false",
    ]
    (tmp_path / "rules.yaml").write_text("\n".join(lines) + "\n")
    policies = load_policies(tmp_path)
    activation = policies.activation({"actor": {}, "capability": {}, "context": {}, "input": {}})
    decision = policies.decide("ns7.op", activation)
    assert [r.rule_id for r in decision.results] == ["rule-7", "everywhere"]
    assert (decision.effect, decision.rule_id) == ("allow", "rule-7")


class CountingEvaluator(CelPythonEvaluator):
    """The reference evaluator, counting how often each variable is converted."""

    def __init__(self) -> None:
        super().__init__()
        self.converted: dict[str, int] = {}

    def activation(
        self, variables: Mapping[str, Any], base: Activation | None = None
    ) -> Activation:
        for name in variables:
            self.converted[name] = self.converted.get(name, 0) + 1
        return super().activation(variables, base)


def test_the_activation_is_built_once_per_decision(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(
        "rules:\n"
        + "".join(
            f'  - id: r{n}\n    capabilities: ["orders.*"]\n    effect: allow\n'
            f'    when: actor.id != "x{n}" && input.n >= 0 && context.surface == "direct"\n'
            for n in range(5)
        )
        + '  - id: h\n    capabilities: ["orders.*"]\n    effect: hide\n    when: now < now\n'
    )
    evaluator = CountingEvaluator()
    policies = load_policies(tmp_path, evaluator=evaluator)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    capability = Capability(
        definition=CapabilityDefinition(
            id="orders.echo", input_schema=schema, output_schema={}, side_effect="read"
        ),
        service="orders",
        digest="d",
        registered_at="2026-01-01T00:00:00Z",
    )
    request = BeginRequest(
        service=Service("orders", ("orders",)),
        invocation_id="i",
        capability_id="orders.echo",
        capability_version="",
        actor_token="",
        input_json="{}",
        surface="direct",
        context={},
        approval_id="",
        idempotency_key="",
    )
    ctx = BeginContext(request=request, policies=policies, now=datetime.now(UTC))
    ctx.capability, ctx.actor, ctx.input = capability, Actor("a", (), "t", {}), {"n": 1}
    assert visibility(None, ctx) is None  # type: ignore[arg-type]
    assert policy(None, ctx) is None  # type: ignore[arg-type]
    assert ctx.decision is not None and ctx.decision.effect == "allow"
    assert len(ctx.decision.results) == 5
    assert evaluator.converted == {"actor": 1, "capability": 1, "context": 1, "now": 1, "input": 1}


def test_cel_syntax_errors_say_what_went_wrong() -> None:
    evaluator = CelPythonEvaluator()
    for text, pattern in [
        ("input.amount >", "ends too soon"),
        ("a &&& b", "unexpected character '&'"),
        ("(a))", r"unexpected '\)'"),
    ]:
        try:
            evaluator.compile(text)
        except Exception as exc:
            assert re.search(pattern, str(exc)), (text, str(exc))
        else:
            raise AssertionError(f"{text!r} compiled")
