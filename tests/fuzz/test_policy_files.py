"""Fuzzing policy files and policy test files with mutations of the example set.

Whatever an author (or a broken editor) writes, loading either yields a
policy set or fails with problems that each name ``file:line:col`` in words;
never an exception of the loader's own, never Python's words.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import EXAMPLE_POLICIES
from tests.fuzz.hostile import HOSTILE_TEXT, INTERNAL_WORDS
from warden_server.policy.loader import PolicyLoadError, Problem, load_policies
from warden_server.policy.testing import load_test_cases

FUZZ = settings(
    max_examples=int(os.environ.get("WARDEN_FUZZ_EXAMPLES", "60")) * 2,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)

POLICY_TEXT = (EXAMPLE_POLICIES / "orders.yaml").read_text()
TESTS_TEXT = (EXAMPLE_POLICIES / "tests" / "orders.yaml").read_text()
# Fragments an author could plausibly get wrong, and worse.
FRAGMENTS = [
    *HOSTILE_TEXT,
    "when: 1/0 == 1",
    'when: matches(actor.id, "[")',
    "when: actor.tenant",
    "when: " + "(" * 500 + "true" + ")" * 500,
    "effect: maybe",
    "- id: ",
    "capabilities: []",
    '"\\ud800"',
    "&a [*a, *a]",
    "!!python/object:os.system",
    "{",
    "\t",
    "ttl: 99999999999999999999d",
    "\ufeff",
]
COUNTER = itertools.count()
# Loading once first lets cel-python raise the recursion limit it wants before
# hypothesis starts watching it.
EXAMPLE_SET = load_policies(EXAMPLE_POLICIES)


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    """The text with a few lines deleted, duplicated, cut, swapped or spiked."""
    lines = text.splitlines(keepends=True)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        if not lines:
            lines = [draw(st.sampled_from(FRAGMENTS)) + "\n"]
        at = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        match draw(st.sampled_from(["delete", "duplicate", "cut", "swap", "insert", "spike"])):
            case "delete":
                del lines[at]
            case "duplicate":
                lines.insert(at, lines[at])
            case "cut":
                lines[at] = lines[at][: draw(st.integers(min_value=0, max_value=len(lines[at])))]
            case "swap":
                other = draw(st.integers(min_value=0, max_value=len(lines) - 1))
                lines[at], lines[other] = lines[other], lines[at]
            case "insert":
                indent = " " * draw(st.sampled_from([0, 2, 4, 6]))
                lines.insert(at, indent + draw(st.sampled_from(FRAGMENTS)) + "\n")
            case _:
                line = lines[at]
                cut = draw(st.integers(min_value=0, max_value=len(line)))
                spike = draw(st.sampled_from(FRAGMENTS) | st.text(max_size=10))
                lines[at] = line[:cut] + spike + line[cut:]
    return "".join(lines)


def write_folder(root: Path, policy: str, tests: str = TESTS_TEXT) -> Path:
    folder = root / f"set-{next(COUNTER)}"
    (folder / "tests").mkdir(parents=True)
    (folder / "orders.yaml").write_text(policy, encoding="utf-8", errors="surrogatepass")
    (folder / "tests" / "orders.yaml").write_text(tests, encoding="utf-8", errors="surrogatepass")
    return folder


def assert_worded(problems: list[Problem], folder: Path) -> None:
    assert problems, "a refused set must say why"
    for problem in problems:
        assert Path(problem.file).parent in (folder, folder / "tests"), problem
        assert problem.line >= 1 and problem.column >= 1, problem
        assert problem.message.strip(), problem
        assert not any(word in problem.message for word in INTERNAL_WORDS), problem


@pytest.mark.heavy
def test_policy_files_load_or_name_each_problem(tmp_path: Path) -> None:
    @FUZZ
    @given(policy=mutated(POLICY_TEXT))
    @example(policy=POLICY_TEXT.replace("input.amount > 10000", "1/0 == 1"))
    @example(policy="rules:\n  - " + "[" * 10_000)
    @example(policy="\ud800")
    def fuzz(policy: str) -> None:
        folder = write_folder(tmp_path, policy)
        try:
            policies = load_policies(folder)
        except PolicyLoadError as exc:
            assert_worded(exc.problems, folder)
            return
        assert policies.revision

    fuzz()


@pytest.mark.heavy
def test_policy_test_files_load_or_name_each_problem(tmp_path: Path) -> None:
    policies = EXAMPLE_SET

    @FUZZ
    @given(tests=mutated(TESTS_TEXT))
    @example(tests="cases:\n  - " + "{" * 10_000)
    def fuzz(tests: str) -> None:
        folder = write_folder(tmp_path, POLICY_TEXT, tests)
        cases, problems = load_test_cases(folder, policies)
        if problems:
            assert_worded(problems, folder)
        else:
            assert cases

    fuzz()
