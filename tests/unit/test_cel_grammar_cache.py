"""cel-python's parser, saved in the user's cache folder and loaded by the next process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import lark
import pytest
from celpy import celparser

from warden_server.policy import grammar
from warden_server.policy.cel import CelPythonEvaluator, EvaluationError, error_in_words

CORPUS = [
    'actor.roles.exists(r, r == "admin") && input.amount > 10',
    "size(input.note) > 500 || !has(input.region)",
    "input.tags.all(t, t.matches('^[a-z]+$')) ? 1u : 2u",
    "{'a': [1, 2.5, null, true, b'x']}['a'][0] == 1",
    "context.now - timestamp('2024-01-01T00:00:00Z') > duration('1h')",
]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty cache folder, and no parser in this process until the test makes one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kept = celparser.CELParser.CEL_PARSER
    celparser.CELParser.CEL_PARSER = None
    grammar.ready.cache_clear()
    try:
        yield tmp_path / "warden"
    finally:
        celparser.CELParser.CEL_PARSER = kept
        grammar.ready.cache_clear()


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the parsers built the way cel-python builds them."""
    built: list[int] = []
    build = celparser.CELParser.__init__

    def counting(self: celparser.CELParser, *args: object, **kwargs: object) -> None:
        if celparser.CELParser.CEL_PARSER is None:
            built.append(1)
        build(self, *args, **kwargs)

    monkeypatch.setattr(celparser.CELParser, "__init__", counting)
    return built


def fresh_process() -> None:
    celparser.CELParser.CEL_PARSER = None
    grammar.ready.cache_clear()


def trees() -> list[lark.Tree[lark.Token]]:
    parser = celparser.CELParser.CEL_PARSER
    assert parser is not None
    return [parser.parse(text) for text in CORPUS]


def test_the_next_process_loads_the_parser_and_it_parses_as_the_one_built(
    cache: Path, builds: list[int]
) -> None:
    grammar.ready()
    assert len(builds) == 1
    (saved,) = cache.iterdir()
    assert saved.stat().st_mode & 0o077 == 0
    assert cache.stat().st_mode & 0o777 == 0o700
    built = trees()

    fresh_process()
    grammar.ready()
    assert len(builds) == 1, "the saved parser was not used"
    loaded = trees()
    assert loaded == built
    assert [t.meta.column for t in loaded] == [t.meta.column for t in built]


def test_a_damaged_file_is_ignored_and_replaced(cache: Path, builds: list[int]) -> None:
    grammar.ready()
    (saved,) = cache.iterdir()
    saved.write_bytes(b"not a parser")

    fresh_process()
    grammar.ready()
    assert len(builds) == 2
    fresh_process()
    grammar.ready()
    assert len(builds) == 2, "the damaged file was not replaced"


def test_a_file_others_may_write_is_not_loaded(cache: Path, builds: list[int]) -> None:
    grammar.ready()
    (saved,) = cache.iterdir()
    os.chmod(saved, 0o620)

    fresh_process()
    grammar.ready()
    assert len(builds) == 2
    assert celparser.CELParser.CEL_PARSER is not None


def test_without_a_cache_folder_the_parser_is_built(
    tmp_path: Path, cache: Path, builds: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # a file: no folder can be made under it
    grammar.ready()
    assert len(builds) == 1
    assert trees()


FAILING = [
    ("actor.level > 5", {"actor": {"level": "x"}}),
    ("input.s + 1 == 2", {"input": {"s": "a"}}),
    ("input.s * 2 == 1", {"input": {"s": "a"}}),
    ("-input.s == 1", {"input": {"s": "a"}}),
    ("!input.n", {"input": {"n": 1}}),
    ("input.n in 5", {"input": {"n": 1}}),
    ("actor.nickname == 'x'", {"actor": {}}),
    ("1 / (input.n - 13) > 0", {"input": {"n": 13}}),
]


def failures() -> list[str]:
    """What each failing expression says in the audit log (``error_in_words``),
    evaluated by the reference evaluator."""
    evaluator = CelPythonEvaluator()
    said = []
    for text, variables in FAILING:
        with pytest.raises(EvaluationError) as raised:
            evaluator.compile(text).evaluate(evaluator.activation(variables))
        said.append(error_in_words(str(raised.value), text))
    return said


def test_a_failing_rule_reads_the_same_with_the_loaded_parser(cache: Path) -> None:
    """A loaded parser names syntax-tree rules with plain text where a built one
    has Lark tokens, and cel-python puts that name in its errors (its four
    "found no matching overload" messages: relation, addition, multiplication,
    unary): they must still come out in the same words (the audit log records
    them)."""
    grammar.ready()
    built = failures()
    assert built[0] == "no operator '>' for (string, int)"
    assert repr(trees()[0].data) == "Token('RULE', 'expr')"

    fresh_process()
    grammar.ready()
    assert repr(trees()[0].data) == "'expr'", "the parser was built again, not loaded"
    assert failures() == built


def test_a_user_without_a_home_folder_gets_a_built_parser(
    cache: Path, builds: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME")

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    grammar.ready()
    assert len(builds) == 1
    assert trees()


_COUNT_LEXER_STATES_BUILT = """
import sys
import lark.lexer
import yaml

if sys.argv[1] == "prepared":
    import warden_server.preload  # what the forkserver imports
from warden_server.policy.serving import evaluator_for

built = []
build = lark.lexer.BasicLexer._build_scanner
lark.lexer.BasicLexer._build_scanner = lambda lexer: built.append(1) or build(lexer)
evaluator = evaluator_for("cel-cpp")
for rule in yaml.safe_load(open(sys.argv[2]))["rules"]:
    for kind in ("when", "message_expr", "approvers"):
        if kind in rule:
            evaluator.compile(rule[kind])
print(len(built))
"""


@pytest.mark.parametrize("prepared", [True, False])
def test_a_process_forked_from_the_prepared_forkserver_compiles_without_building_the_lexer(
    prepared: bool,
) -> None:
    """``warden_server.preload`` readies, once in the forkserver, what a first
    compile builds lazily: a joining process compiles the example policies'
    conditions without building any of the lexer's states (each costs a few
    milliseconds of regular expressions). Unprepared, the same compile builds
    them, which shows the count is real."""
    import subprocess
    import sys

    policies = Path(__file__).parents[2] / "policies" / "orders.yaml"
    how = "prepared" if prepared else "cold"
    counted = subprocess.run(
        [sys.executable, "-c", _COUNT_LEXER_STATES_BUILT, how, str(policies)],
        capture_output=True,
        text=True,
        check=True,
    )
    built = int(counted.stdout)
    assert (built == 0) if prepared else (built > 0), counted.stdout
