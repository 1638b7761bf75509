"""The policy loader: every problem at once, as ``file:line:col: path: message``,
sorted; and the policy set's revision as a content hash."""

from __future__ import annotations

import gc
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE_POLICIES
from warden_server.policy.inputs import InputSchema
from warden_server.policy.loader import PolicyLoadError, Problem, load_policies
from warden_server.reload import collector_paused


def write(folder: Path, **files: str) -> Path:
    """Create ``folder`` with one file per keyword (``a_yaml`` -> ``a.yaml``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text, encoding="utf-8")
    return folder


def problems_of(folder: Path) -> list[str]:
    """The loader's problems for ``folder``, as strings (it must fail)."""
    with pytest.raises(PolicyLoadError) as caught:
        load_policies(folder)
    return [str(p) for p in caught.value.problems]


def char_at(path: Path, line: int, column: int) -> str:
    """The text of ``path`` from 1-based ``line``/``column`` to the end of that line."""
    return path.read_text(encoding="utf-8").splitlines()[line - 1][column - 1 :]


def position(problem: str) -> tuple[int, int]:
    match = re.match(r"^.*?:(\d+):(\d+): ", problem)
    assert match, problem
    return int(match.group(1)), int(match.group(2))


VALID_RULE = """\
  - id: ok
    capabilities: ["orders.*"]
    effect: allow
"""


# -- single kinds of problem ------------------------------------------------


def test_yaml_syntax_error_is_reported_with_its_position(tmp_path: Path) -> None:
    """Broken YAML names the file and the line and column of the fault."""
    folder = write(tmp_path / "p", bad_yaml="rules: [\n  - id\n")
    assert problems_of(folder) == [
        f"{folder}/bad.yaml:2:3: YAML syntax error: expected the node content, but found '-'"
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "2026-02-30",
            "YAML: '2026-02-30' does not fit the type YAML reads it as"
            " (timestamp: day is out of range for month); quote dates and times",
        ),
        (
            "2026-13-45T00:00:00Z",
            "YAML: '2026-13-45T00:00:00Z' does not fit the type YAML reads it as"
            " (timestamp: month must be in 1..12); quote dates and times",
        ),
        (
            "!!int abc",
            "YAML: 'abc' does not fit the type YAML reads it as"
            " (int: invalid literal for int() with base 10: 'abc')",
        ),
        ("!shout hi", "YAML: could not determine a constructor for the tag '!shout'"),
    ],
)
def test_a_scalar_yaml_cannot_make_a_value_of_is_a_problem_at_its_position(
    tmp_path: Path, value: str, message: str
) -> None:
    """An unquoted impossible date, or a tag YAML has no type for, is one
    problem at the scalar, not a crash of the loader (and so of the check,
    the tests and a hot reload)."""
    folder = write(tmp_path / "p", a_yaml=f"constants:\n  start: {value}\nrules: []\n")
    assert problems_of(folder) == [f"{folder}/a.yaml:2:10: {message}"]


def test_unknown_key_is_reported_on_its_line(tmp_path: Path) -> None:
    """The position is the unknown key itself (yamlpos records key nodes too)."""
    folder = write(tmp_path / "p", a_yaml="rules:\n" + VALID_RULE + "    colour: red\n")
    assert problems_of(folder) == [f"{folder}/a.yaml:5:5: rules[0].colour: unknown key"]


def test_unknown_top_level_key(tmp_path: Path) -> None:
    folder = write(tmp_path / "p", a_yaml="rulez: []\n")
    assert problems_of(folder) == [
        f"{folder}/a.yaml:1:1: rulez: unknown key (did you mean 'rules'?)"
    ]


def test_an_unknown_key_names_the_key_it_most_resembles_where_it_stands(tmp_path: Path) -> None:
    """In a rule, a limit, or nowhere near any known key."""
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: allow\n"
            "    whne: 'true'\n"
            "limits:\n"
            "  - id: l\n"
            '    capabilities: ["orders.x"]\n'
            "    rat: 10/min\n"
            "    zzzz: 1\n"
        ),
    )
    assert [p.split(": ", 1)[1] for p in problems_of(folder)] == [
        "rules[0].whne: unknown key (did you mean 'when'?)",
        "limits[0].rat: unknown key (did you mean 'rate'?)",
        "limits[0].zzzz: unknown key",
    ]


def test_missing_capabilities_and_effect_are_both_reported(tmp_path: Path) -> None:
    """A rule missing two required keys yields two problems, at the rule."""
    folder = write(tmp_path / "p", a_yaml="rules:\n  - id: lonely\n")
    assert problems_of(folder) == [
        f"{folder}/a.yaml:2:5: rules[0].capabilities: missing required key",
        f"{folder}/a.yaml:2:5: rules[0].effect: missing required key",
    ]


def test_bad_effect_value_lists_the_allowed_effects(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "p",
        a_yaml='rules:\n  - id: r\n    capabilities: ["orders.x"]\n    effect: maybe\n',
    )
    assert problems_of(folder) == [
        f"{folder}/a.yaml:4:13: rules[0].effect: "
        "must be 'allow', 'deny', 'require_approval' or 'hide'"
    ]


def test_cel_syntax_error_column_points_into_a_plain_expression(tmp_path: Path) -> None:
    """The column is the file column of the offending token, not of the key."""
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: deny\n"
            "    when: input.amount > && true\n"
        ),
    )
    [problem] = problems_of(folder)
    assert problem == (f"{folder}/a.yaml:5:26: rules[0].when: CEL syntax error: unexpected '&&'")
    assert char_at(folder / "a.yaml", *position(problem)).startswith("&&")


def test_cel_syntax_error_column_accounts_for_quotes(tmp_path: Path) -> None:
    """In a quoted scalar the opening quote shifts the expression by one column."""
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: deny\n"
            "    when: 'true && && false'\n"
        ),
    )
    [problem] = problems_of(folder)
    assert problem.startswith(f"{folder}/a.yaml:5:")
    assert "rules[0].when: CEL syntax error" in problem
    assert char_at(folder / "a.yaml", *position(problem)).startswith("&& false")


def test_cel_syntax_error_in_a_block_scalar_points_at_the_token(tmp_path: Path) -> None:
    """A ``|`` block expression: the line is the expression's line in the file
    and the column must include the block's indentation."""
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: deny\n"
            "    when: |\n"
            "      true &&\n"
            "      input.amount > 1 +\n"
        ),
    )
    [problem] = problems_of(folder)
    line, column = position(problem)
    assert line == 7
    assert "rules[0].when: CEL syntax error" in problem
    # cel-python reports a dangling operator at the operator itself.
    assert char_at(folder / "a.yaml", line, column) == "+"


@pytest.mark.parametrize(
    ("when", "line"),
    [
        # A folded block, its lines joined by spaces: the name is on the second.
        (">-\n      true &&\n      actr.id == 'a'\n", 7),
        (">\n      true && true\n      && actr.id == 'a'\n", 7),
        # A plain scalar over two lines folds the same way.
        ("true &&\n      actr.id == 'a'\n", 6),
    ],
    ids=["folded", "folded-clip", "plain"],
)
def test_a_problem_in_a_folded_expression_points_at_its_token(
    tmp_path: Path, when: str, line: int
) -> None:
    folder = write(
        tmp_path / "p",
        a_yaml=(
            f'rules:\n  - id: r\n    capabilities: ["orders.x"]\n    effect: deny\n    when: {when}'
        ),
    )
    [problem] = problems_of(folder)
    assert "rules[0].when: unknown variable 'actr'" in problem
    assert position(problem)[0] == line
    assert char_at(folder / "a.yaml", *position(problem)) == "actr.id == 'a'"


def test_unknown_variable_is_named_with_the_available_ones(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: deny\n"
            '    when: user.name == "x"\n'
        ),
    )
    assert problems_of(folder) == [
        f"{folder}/a.yaml:5:11: rules[0].when: unknown variable 'user' "
        "(available: actor, capability, context, input, now)"
    ]


def test_unknown_variables_in_message_expr(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: deny\n"
            "    message_expr: foo + bar\n"
        ),
    )
    # Each unknown variable once, at the place it is read.
    assert problems_of(folder) == [
        f"{folder}/a.yaml:5:19: rules[0].message_expr: unknown variable 'foo' "
        "(available: actor, capability, context, input, now)",
        f"{folder}/a.yaml:5:25: rules[0].message_expr: unknown variable 'bar' "
        "(available: actor, capability, context, input, now)",
    ]


def test_hide_rule_may_not_use_input(tmp_path: Path) -> None:
    """Hide rules run before input validation: ``input`` is not available."""
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: hide\n"
            "    when: input.amount > 5\n"
        ),
    )
    assert problems_of(folder) == [
        f"{folder}/a.yaml:5:11: rules[0].when: "
        "hide rules run before input validation and cannot read 'input'",
    ]


def test_approvers_and_ttl_only_on_require_approval(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: deny\n"
            "    approvers: 'true'\n"
            "    ttl: 1h\n"
        ),
    )
    assert problems_of(folder) == [
        f"{folder}/a.yaml:5:5: rules[0].approvers: "
        "'approvers' applies only to require_approval rules",
        f"{folder}/a.yaml:6:5: rules[0].ttl: 'ttl' applies only to require_approval rules",
    ]


@pytest.mark.parametrize(
    ("ttl", "message"),
    [
        ("soon", "'soon' is not a duration like 90s, 30m, 1h or 7d"),
        ("90", "90 has no unit: give a duration like 90s, 30m, 1h or 7d"),
        (
            "0s",
            "'0s': an approval request open for no time expires at once;"
            " give a duration above zero, like 1h",
        ),
        # Past the calendar's end: the plane could not compute when it expires.
        ("99999999999d", "'99999999999d' is longer than the longest duration, 36500d"),
        ("1" * 40 + "s", f"'{'1' * 40}s' is not a duration like 90s, 30m, 1h or 7d"),
    ],
)
def test_bad_ttl(tmp_path: Path, ttl: str, message: str) -> None:
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: require_approval\n"
            f"    ttl: {ttl}\n"
        ),
    )
    assert problems_of(folder) == [f"{folder}/a.yaml:5:10: rules[0].ttl: {message}"]


@pytest.mark.parametrize("effect", ["allow", "hide"])
def test_a_message_only_on_rules_that_refuse(tmp_path: Path, effect: str) -> None:
    """No model sees the message of an allow or a hide rule (a hidden
    capability answers "not found"): writing one is a mistake, not a no-op."""
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r\n"
            '    capabilities: ["orders.x"]\n'
            f"    effect: {effect}\n"
            "    message: Ask a manager.\n"
            "    message_expr: \"'Ask ' + actor.id\"\n"
        ),
    )
    assert problems_of(folder) == [
        f"{folder}/a.yaml:5:5: rules[0].message: "
        "'message' applies only to deny and require_approval rules",
        f"{folder}/a.yaml:6:5: rules[0].message_expr: "
        "'message_expr' applies only to deny and require_approval rules",
    ]


def test_good_ttl_is_compiled_to_seconds(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: require_approval\n"
            "    ttl: 90m\n"
        ),
    )
    [rule] = load_policies(folder).rules
    assert rule.ttl_seconds == 5400
    assert rule.approvers is not None  # defaults to "true"


def test_duplicate_rule_id_across_files_names_the_first_definition(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "p",
        a_yaml='rules:\n  - id: twice\n    capabilities: ["orders.x"]\n    effect: allow\n',
        b_yaml=(
            "rules:\n"
            "  - id: other\n"
            '    capabilities: ["orders.y"]\n'
            "    effect: allow\n"
            "  - id: twice\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: deny\n"
        ),
    )
    assert problems_of(folder) == [
        f"{folder}/b.yaml:5:9: rules[1].id: duplicate rule id 'twice' "
        f"(first defined at {folder}/a.yaml:2:9)"
    ]


def test_duplicate_yaml_key(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: allow\n"
            "    effect: deny\n"
        ),
    )
    assert problems_of(folder) == [f"{folder}/a.yaml:5:5: rules[0].effect: duplicate key"]


# -- folders ------------------------------------------------------------------


def test_empty_folder_is_a_valid_empty_set(tmp_path: Path) -> None:
    folder = write(tmp_path / "empty")
    policies = load_policies(folder)
    assert policies.rules == ()
    assert policies.files == ()
    assert policies.default_effect == "deny"


def test_empty_file_is_a_valid_empty_set(tmp_path: Path) -> None:
    policies = load_policies(write(tmp_path / "p", a_yaml=""))
    assert policies.rules == ()
    assert policies.files == ("a.yaml",)


def test_missing_folder_is_a_problem(tmp_path: Path) -> None:
    folder = tmp_path / "nowhere"
    assert problems_of(folder) == [f"{folder}: no such policy folder"]


def test_tests_subfolder_and_other_files_are_not_rules(tmp_path: Path) -> None:
    """Only *.yaml/*.yml files at the top level are policy files."""
    folder = write(tmp_path / "p", a_yml="rules:\n" + VALID_RULE, README_md="# not YAML: [")
    write(folder / "tests", t_yaml="tests: []\n")
    policies = load_policies(folder)
    assert [r.id for r in policies.rules] == ["ok"]
    assert policies.files == ("a.yml",)


# -- all at once --------------------------------------------------------------


def test_every_problem_of_every_file_at_once_sorted(tmp_path: Path) -> None:
    """Problems from several files come together, sorted by file, line, column."""
    folder = write(
        tmp_path / "p",
        c_yaml="rules: [\n",
        a_yaml=(
            "rules:\n"
            "  - id: r1\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: deny\n"
            "    when: nobody.here\n"
            "  - id: r2\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: allow\n"
            "    ttl: 1h\n"
            "    when: 1 +\n"
        ),
        b_yaml=("rules:\n  - id: r3\n    effect: hide\n    when: input.x\n"),
    )
    with pytest.raises(PolicyLoadError) as caught:
        load_policies(folder)
    problems = caught.value.problems
    assert problems == sorted(problems)
    assert [(Path(p.file).name, p.line, p.path) for p in problems] == [
        ("a.yaml", 5, "rules[0].when"),
        ("a.yaml", 9, "rules[1].ttl"),
        ("a.yaml", 10, "rules[1].when"),
        ("b.yaml", 2, "rules[0].capabilities"),
        ("b.yaml", 4, "rules[0].when"),  # still checked although the rule is broken
        ("c.yaml", 2, ""),
    ]
    assert str(caught.value) == "\n".join(str(p) for p in problems)


def test_schema_problems_do_not_hide_expression_problems_in_the_same_file(
    tmp_path: Path,
) -> None:
    """One bad effect in rule 1 must not hide the CEL syntax error in rule 0:
    the loader reports every problem at once."""
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r0\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: deny\n"
            "    when: 1 +\n"
            "  - id: r1\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: maybe\n"
        ),
    )
    paths = [p.split(": ")[1] for p in problems_of(folder)]
    assert paths == ["rules[0].when", "rules[1].effect"]


def test_a_broken_limit_does_not_hide_the_problems_of_the_others(tmp_path: Path) -> None:
    """A limit whose shape is wrong (a rate per week) leaves the other limits
    checked whole (a key of the wrong type, a duplicate id) and its own
    expressions checked as written."""
    limit = '  - id: {id}\n    capabilities: ["orders.x"]\n    rate: {rate}\n    key: {key}\n'
    folder = write(
        tmp_path / "p",
        a_yaml=(
            "rules:\n"
            "  - id: r0\n"
            '    capabilities: ["orders.x"]\n'
            "    effect: allow\n"
            "limits:\n"
            + limit.format(id="l0", rate="10/week", key="actor.nme")
            + limit.format(id="l1", rate="10/min", key="actor.roles")
            + limit.format(id="r0", rate="10/min", key="actor.id")
        ),
    )
    assert [p.split(": ")[1] for p in problems_of(folder)] == [
        "limits[0].rate",
        "limits[0].key",  # actor.nme: checked although the limit is broken
        "limits[1].key",  # a list, not a string
        "limits[2].id",  # the rule's id again
    ]


def test_problem_string_without_a_path() -> None:
    assert str(Problem("f.yaml", 3, 7, "", "boom")) == "f.yaml:3:7: boom"
    assert str(Problem("f.yaml", 3, 7, "rules[0]", "boom")) == "f.yaml:3:7: rules[0]: boom"


# -- revision -----------------------------------------------------------------

RULES = 'rules:\n  - id: r\n    capabilities: ["orders.x"]\n    effect: allow\n'


def test_revision_is_a_content_hash(tmp_path: Path) -> None:
    """Same content in another folder: same revision; one changed byte: another."""
    first = load_policies(write(tmp_path / "one", a_yaml=RULES)).revision
    again = load_policies(write(tmp_path / "two", a_yaml=RULES)).revision
    changed = load_policies(
        write(tmp_path / "three", a_yaml=RULES.replace("allow", "deny "))
    ).revision
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    assert first == again
    assert changed != first


def test_revision_changes_with_a_single_byte(tmp_path: Path) -> None:
    folder = write(tmp_path / "p", a_yaml=RULES)
    before = load_policies(folder).revision
    (folder / "a.yaml").write_text(RULES + "\n")
    after = load_policies(folder).revision
    assert before != after
    (folder / "a.yaml").write_text(RULES)
    assert load_policies(folder).revision == before


@pytest.mark.parametrize("order", ["alike first", "different first"])
def test_a_rule_is_type_checked_against_every_distinct_input_schema(
    tmp_path: Path, order: str
) -> None:
    """Capabilities that share an input schema are checked once; one whose
    schema differs is still checked, whichever comes first."""
    from warden_server.policy.celcpp import CelCppEvaluator
    from warden_server.policy.inputs import InputSchema

    (tmp_path / "rules.yaml").write_text(
        'rules:\n  - id: big\n    capabilities: ["orders.*"]\n'
        "    effect: deny\n    when: input.amount > 5\n"
    )
    number = {"type": "object", "properties": {"amount": {"type": "integer"}}}
    text = {"type": "object", "properties": {"amount": {"type": "string"}}}
    alike = [InputSchema(f"orders.n{i}", dict(number), "1") for i in range(3)]
    different = [InputSchema("orders.text", text, "1")]
    schemas = alike + different if order == "alike first" else different + alike
    with pytest.raises(PolicyLoadError) as raised:
        load_policies(tmp_path, evaluator=CelCppEvaluator(), capabilities=schemas)
    (problem,) = raised.value.problems
    assert problem.line == 5
    assert problem.message.endswith("input.amount is a string in orders.text v1")
    load_policies(tmp_path, evaluator=CelCppEvaluator(), capabilities=alike)


def deny_rules(*rules: tuple[str, str, str]) -> str:
    """A policy file of deny rules, each ``(id, capability, condition)``; the
    n-th rule's condition is on line 4n + 1."""
    return "rules:\n" + "".join(
        f'  - id: {id}\n    capabilities: ["{capability}"]\n    effect: deny\n    when: {when}\n'
        for id, capability, when in rules
    )


def test_capabilities_sharing_a_schema_are_each_named_in_their_own_problems(
    tmp_path: Path,
) -> None:
    """The checker makes one message type per distinct schema; a problem
    still names the capability whose rule it is in, not the first one that
    had the schema."""
    from warden_server.policy.celcpp import CelCppEvaluator
    from warden_server.policy.inputs import InputSchema

    (tmp_path / "rules.yaml").write_text(
        deny_rules(
            ("list", "orders.list", 'input.amount == "0"'),
            ("pay", "orders.pay", "input.amount > 5"),
        )
    )
    text = {"type": "object", "properties": {"amount": {"type": "string"}}}
    schemas = [InputSchema(name, dict(text), "2") for name in ("orders.list", "orders.pay")]
    with pytest.raises(PolicyLoadError) as raised:
        load_policies(tmp_path, evaluator=CelCppEvaluator(), capabilities=schemas)
    (problem,) = raised.value.problems
    assert problem.message.endswith("input.amount is a string in orders.pay v2")


def test_a_field_declared_by_one_schema_is_still_missing_from_another(tmp_path: Path) -> None:
    """What the loader remembers of a field found declared holds for schemas
    alike, never for a schema that differs."""
    from warden_server.policy.inputs import InputSchema

    (tmp_path / "rules.yaml").write_text(
        deny_rules(("a", "orders.a", "input.amount > 5"), ("b", "orders.b", "input.amount > 5"))
    )
    declares = {"type": "object", "properties": {"amount": {"type": "integer"}}}
    lacks = {"type": "object", "properties": {"total": {"type": "integer"}}}
    schemas = [InputSchema("orders.a", declares, "1"), InputSchema("orders.b", lacks, "1")]
    with pytest.raises(PolicyLoadError) as raised:
        load_policies(tmp_path, capabilities=schemas)
    (problem,) = raised.value.problems
    assert problem.line == 9
    assert "has no field 'amount' in the input schema of orders.b v1" in problem.message


# -- what a compile leaves behind --------------------------------------------


def test_compiling_a_policy_set_leaves_no_garbage_in_reference_cycles() -> None:
    """What a compile does not keep (each file's parsed document above all: a
    tuple per node) is freed by reference counting as it goes. Left in
    cycles, it waited for the cycle collector, whose passes during a large
    compile (paused since: ``reload.collector_paused``) walked it again and
    again."""
    snapshot = json.loads((EXAMPLE_POLICIES / "capabilities.json").read_text())
    capabilities = [
        InputSchema(c["id"], c["input_schema"], c["version"]) for c in snapshot["capabilities"]
    ]
    load_policies(EXAMPLE_POLICIES, capabilities=capabilities)  # what is made once per process
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        policies = load_policies(EXAMPLE_POLICIES, capabilities=capabilities)
        gc.collect()
        left = Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    assert policies.rules and policies.limits, "the example set should exercise rules and limits"
    assert not left, f"objects left in reference cycles by a compile: {left.most_common(8)}"


def test_the_collector_is_paused_while_a_set_compiles_and_resumes_after() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(PolicyLoadError), collector_paused():
        raise PolicyLoadError([], "revision", ())
    assert gc.isenabled(), "a compile that failed left the collector off"
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled(), "a collector that was off was turned on"
    finally:
        gc.enable()
