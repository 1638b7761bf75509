"""Decisions of a compiled policy set: effects, precedence, defaults, audit
mode, runtime errors, messages and glob matching."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from warden_server.policy.engine import Decision, PolicySet
from warden_server.policy.loader import load_policies


def policies(
    tmp_path: Path, text: str, default_effect: Literal["allow", "deny"] = "deny"
) -> PolicySet:
    """Load one policy file's YAML from a fresh folder."""
    folder = tmp_path / "policies"
    folder.mkdir(exist_ok=True)
    (folder / "rules.yaml").write_text(text, encoding="utf-8")
    return load_policies(folder, default_effect=default_effect)


def variables(
    capability: str = "orders.refund",
    roles: tuple[str, ...] = ("support",),
    **input: Any,
) -> dict[str, Any]:
    return {
        "actor": {"id": "bot-7", "roles": list(roles), "tenant": "acme", "attrs": {}},
        "capability": {
            "id": capability,
            "version": "1",
            "service": "orders",
            "side_effect": "write",
            "tags": [],
        },
        "input": input,
        "context": {"surface": "direct"},
        "now": datetime(2025, 1, 1, tzinfo=UTC),
    }


def decide(ps: PolicySet, capability: str = "orders.refund", **kw: Any) -> Decision:
    return ps.decide(capability, ps.activation(variables(capability, **kw)))


def final(ps: PolicySet, capability: str = "orders.refund", **kw: Any) -> Decision:
    """The whole flow: visibility first (without input), then the decision."""
    seen = variables(capability, **kw)
    del seen["input"]
    hidden = ps.visibility(capability, ps.activation(seen))
    return hidden if hidden.effect == "hide" else decide(ps, capability, **kw)


def rule(rule_id: str, effect: str, when: str = "true", extra: str = "") -> str:
    text = (
        f"  - id: {rule_id}\n"
        '    capabilities: ["orders.*"]\n'
        f"    effect: {effect}\n"
        f"    when: '{when}'\n"
    )
    return text + extra


# -- each effect --------------------------------------------------------------


def test_allow(tmp_path: Path) -> None:
    ps = policies(tmp_path, "rules:\n" + rule("a", "allow"))
    d = decide(ps)
    assert (d.effect, d.rule_id) == ("allow", "a")


def test_deny_with_its_message(tmp_path: Path) -> None:
    ps = policies(tmp_path, "rules:\n" + rule("d", "deny", extra="    message: Do not refund.\n"))
    d = decide(ps)
    assert (d.effect, d.rule_id, d.message) == ("deny", "d", "Do not refund.")


def test_require_approval_uses_input(tmp_path: Path) -> None:
    ps = policies(
        tmp_path,
        "rules:\n" + rule("big", "require_approval", "input.amount > 500") + rule("ok", "allow"),
    )
    assert decide(ps, amount=730).effect == "require_approval"
    assert decide(ps, amount=730).rule_id == "big"
    assert decide(ps, amount=20).effect == "allow"


def test_hide_is_decided_by_visibility_not_decide(tmp_path: Path) -> None:
    """Hide rules run in the visibility step; decide() ignores them."""
    ps = policies(
        tmp_path, "rules:\n" + rule("h", "hide", '!("admin" in actor.roles)') + rule("a", "allow")
    )
    activation = ps.activation({k: v for k, v in variables().items() if k != "input"})
    hidden = ps.visibility("orders.refund", activation)
    assert (hidden.effect, hidden.rule_id) == ("hide", "h")
    assert decide(ps).effect == "allow"
    admin = ps.activation({**variables(roles=("admin",)), "input": {}})
    assert ps.visibility("orders.refund", admin).effect == "allow"


# -- precedence ---------------------------------------------------------------

ALL_FOUR = ("allow", "require_approval", "deny", "hide")


def test_precedence_hide_deny_require_approval_allow(tmp_path: Path) -> None:
    """With several matching rules the strongest wins, whatever the file order."""
    for strongest in range(len(ALL_FOUR)):
        present = ALL_FOUR[: strongest + 1]
        folder = tmp_path / f"case{strongest}"
        folder.mkdir()
        # Weakest effect last in the file so that file order cannot explain the result.
        text = "rules:\n" + "".join(rule(f"r-{e}", e) for e in reversed(present))
        d = final(policies(folder, text))
        assert (d.effect, d.rule_id) == (present[-1], f"r-{present[-1]}")


def test_first_matching_rule_of_an_effect_decides(tmp_path: Path) -> None:
    ps = policies(
        tmp_path,
        "rules:\n"
        + rule("first", "deny", extra="    message: first\n")
        + rule("second", "deny", extra="    message: second\n"),
    )
    d = decide(ps)
    assert (d.rule_id, d.message) == ("first", "first")


# -- defaults -----------------------------------------------------------------


def test_default_deny_when_no_rule_matches(tmp_path: Path) -> None:
    ps = policies(tmp_path, "rules:\n" + rule("never", "allow", "false"))
    d = decide(ps)
    assert (d.effect, d.rule, d.message) == ("deny", None, None)
    assert [(r.rule_id, r.matched) for r in d.results] == [("never", False)]


def test_default_allow_when_configured(tmp_path: Path) -> None:
    ps = policies(tmp_path, "rules:\n" + rule("never", "deny", "false"), default_effect="allow")
    d = decide(ps)
    assert (d.effect, d.rule) == ("allow", None)


def test_no_rules_for_the_capability_gives_the_default(tmp_path: Path) -> None:
    ps = policies(tmp_path, "rules:\n" + rule("a", "allow"))
    assert decide(ps, "billing.charge").effect == "deny"
    assert decide(ps, "billing.charge").results == ()


# -- errors and audit mode ----------------------------------------------------


def test_runtime_error_in_an_enforced_rule_fails_closed(tmp_path: Path) -> None:
    """A missing field is a CEL runtime error: the decision is ``error``, even
    though an allow rule matched."""
    ps = policies(
        tmp_path, "rules:\n" + rule("a", "allow") + rule("big", "deny", "input.amount > 500")
    )
    d = decide(ps)  # no "amount" in the input
    assert d.effect == "error"
    assert d.rule is None
    [failed] = [r for r in d.results if r.rule_id == "big"]
    assert failed.error and not failed.matched
    assert "error" in failed.to_json()


def test_non_bool_when_is_an_error(tmp_path: Path) -> None:
    # Untyped input is dyn: the checker cannot prove it is not a bool.
    ps = policies(tmp_path, "rules:\n" + rule("a", "allow") + rule("num", "deny", "input.count"))
    d = decide(ps, count=2)
    assert d.effect == "error"
    [bad] = [r for r in d.results if r.rule_id == "num"]
    assert bad.error == "'when' must be a bool, got int"


def test_erroring_hide_rule_conceals(tmp_path: Path) -> None:
    """Revealing existence is a disclosure: a broken enforced hide rule hides."""
    ps = policies(
        tmp_path, "rules:\n" + rule("h", "hide", "actor.attrs.missing") + rule("a", "allow")
    )
    seen = {k: v for k, v in variables().items() if k != "input"}
    assert ps.visibility("orders.refund", ps.activation(seen)).effect == "hide"


def test_erroring_audit_rule_does_not_fail_the_decision(tmp_path: Path) -> None:
    ps = policies(
        tmp_path,
        "rules:\n"
        + rule("a", "allow")
        + rule("trial", "deny", "input.amount > 500", extra="    mode: audit\n"),
    )
    d = decide(ps)
    assert (d.effect, d.rule_id) == ("allow", "a")
    [trial] = [r for r in d.results if r.rule_id == "trial"]
    assert trial.mode == "audit"
    assert trial.error is not None


def test_audit_mode_deny_is_recorded_but_not_enforced(tmp_path: Path) -> None:
    ps = policies(
        tmp_path,
        "rules:\n"
        + rule("a", "allow")
        + rule("would-deny", "deny", "input.amount > 500", extra="    mode: audit\n"),
    )
    d = decide(ps, amount=900)
    assert (d.effect, d.rule_id) == ("allow", "a")
    assert {"id": "would-deny", "effect": "deny", "mode": "audit", "matched": True} in (
        d.rules_json()
    )


def test_audit_mode_hide_does_not_hide(tmp_path: Path) -> None:
    ps = policies(
        tmp_path, "rules:\n" + rule("h", "hide", extra="    mode: audit\n") + rule("a", "allow")
    )
    d = final(ps)
    assert d.effect == "allow"


# -- messages -----------------------------------------------------------------


def test_message_expr_is_used(tmp_path: Path) -> None:
    extra = (
        "    message: static\n"
        '    message_expr: \'"Refunds above " + string(input.limit) + " need a manager."\'\n'
    )
    ps = policies(tmp_path, "rules:\n" + rule("d", "deny", extra=extra))
    assert decide(ps, limit=500).message == "Refunds above 500 need a manager."


def test_message_expr_falls_back_to_message_when_it_errors(tmp_path: Path) -> None:
    extra = "    message: static\n    message_expr: input.nothing_here\n"
    ps = policies(tmp_path, "rules:\n" + rule("d", "deny", extra=extra))
    d = decide(ps)
    assert (d.effect, d.message) == ("deny", "static")


def test_message_expr_that_is_not_a_string_falls_back(tmp_path: Path) -> None:
    extra = "    message: static\n    message_expr: input.count\n"
    ps = policies(tmp_path, "rules:\n" + rule("d", "deny", extra=extra))
    assert decide(ps, count=3).message == "static"


# -- globs --------------------------------------------------------------------


def test_glob_matches_within_its_namespace_only(tmp_path: Path) -> None:
    ps = policies(tmp_path, "rules:\n" + rule("a", "allow"))
    assert decide(ps, "orders.refund").effect == "allow"
    assert decide(ps, "billing.x").effect == "deny"
    [compiled] = ps.rules
    assert compiled.applies_to("orders.refund")
    assert not compiled.applies_to("billing.x")
    assert not compiled.applies_to("ordersx.refund")


def test_rules_for_returns_only_matching_rules_in_load_order(tmp_path: Path) -> None:
    text = (
        "rules:\n"
        '  - id: refund-only\n    capabilities: ["orders.refund"]\n    effect: allow\n'
        '  - id: billing\n    capabilities: ["billing.*"]\n    effect: deny\n'
        '  - id: any-order\n    capabilities: ["orders.*"]\n    effect: deny\n'
        '  - id: two-globs\n    capabilities: ["billing.x", "orders.re*"]\n    effect: hide\n'
    )
    ps = policies(tmp_path, text)
    assert [r.id for r in ps.rules_for("orders.refund")] == [
        "refund-only",
        "any-order",
        "two-globs",
    ]
    assert [r.id for r in ps.rules_for("orders.get")] == ["any-order"]
    assert [r.id for r in ps.rules_for("billing.x")] == ["billing", "two-globs"]
    assert ps.rules_for("shipping.track") == ()
    # Memoized lookups answer the same.
    assert [r.id for r in ps.rules_for("orders.get")] == ["any-order"]


# -- variables ----------------------------------------------------------------


def test_context_capability_and_now_are_available(tmp_path: Path) -> None:
    when = (
        'context.surface == "direct" && capability.service == "orders" '
        '&& now > timestamp("2024-01-01T00:00:00Z")'
    )
    ps = policies(tmp_path, "rules:\n" + rule("a", "allow", when))
    assert decide(ps).effect == "allow"
