"""Golden files for `warden policy check`: one folder of broken policies per
kind of problem, with the exact messages and positions expected.

Regenerate with `pytest tests/unit/test_policy_check_golden.py --update-golden`
and review the diff.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from warden_server.cli import main

CASES = Path(__file__).resolve().parent.parent / "testdata" / "policy_check"


def run_check(case: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The checker's output as an author sees it, run from inside the case folder
    so that file names in the golden files are relative."""
    monkeypatch.chdir(case)
    args = ["policy", "check", "."]
    if (case / "capabilities.json").exists():
        args += ["--capabilities", "capabilities.json"]
    result = CliRunner().invoke(main, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return f"{result.output}[exit {result.exit_code}]\n"


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir() if p.is_dir()))
def test_checker_output_matches_golden(
    case: str, monkeypatch: pytest.MonkeyPatch, update_golden: bool
) -> None:
    folder = CASES / case
    output = run_check(folder, monkeypatch)
    golden = folder / "expected.txt"
    if update_golden:
        golden.write_text(output)
    assert golden.exists(), f"no golden file for {case}: run pytest with --update-golden"
    assert output == golden.read_text(), f"{case}: output differs from {golden}"


def test_every_golden_case_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case is a broken folder: the checker must exit 1 on all of them."""
    for case in sorted(p for p in CASES.iterdir() if p.is_dir()):
        assert run_check(case, monkeypatch).endswith("[exit 1]\n"), case.name


def test_golden_cases_cover_every_kind_of_problem() -> None:
    """The kinds SPEC §6 and the checker promise, each with its own case."""
    expected = {
        "yaml_syntax",
        "unknown_key",
        "missing_key",
        "bad_effect",
        "cel_syntax",
        "unknown_variable",
        "unknown_field",
        "input_field",
        "duplicate_rule_id",
        "duplicate_key",
        "bad_glob",
        "approval_keys",
        "cost_limit",
        "test_files",
        "many_problems",
        # The type checker: each mistake that would fail every matching call.
        "type_integer_compared_with_string",
        "type_string_compared_with_integer",
        "type_list_compared_with_integer",
        "type_size_of_integer",
        "constant_division_by_zero",
        "constant_invalid_regex",
        "type_condition_not_bool",
        "type_result_kinds",
        # variables: and constants: are checked where they are written.
        "variable_type_errors",
        "variable_references",
    }
    assert expected <= {p.name for p in CASES.iterdir() if p.is_dir()}
