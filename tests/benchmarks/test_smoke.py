"""Every benchmark runs in quick mode, so that ``make bench`` cannot rot
unseen: a benchmark added to ``benchmarks/`` is picked up here by itself."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import platform
import subprocess
import sys
import types
from pathlib import Path

import pytest

import benchmarks

ROOT = Path(benchmarks.__file__).resolve().parents[1]

NAMES = sorted(
    m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.startswith("bench_")
)


@pytest.mark.heavy
@pytest.mark.parametrize("name", NAMES)
def test_quick_run_succeeds(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    assert module.run(quick=True) is True
    # It says where its figures went, and they are there, in a smoke run's own
    # file: a smoke run in make test never overwrites a full run's figures.
    short = name.removeprefix("bench_")
    assert f"results: var/bench/{short}.quick.json\n" in capsys.readouterr().out
    written = json.loads((benchmarks.RESULTS / f"{short}.quick.json").read_text())
    assert (written["benchmark"], written["quick"]) == (short, True)


def test_results_name_the_machine_they_were_measured_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared machine moves between hosts: figures of two runs compare only
    by their ratios unless the JSON says what each ran on."""
    monkeypatch.setattr(benchmarks, "RESULTS", tmp_path)
    path = benchmarks.write_results("example", {"rps": 1.0}, ok=True, quick=True)
    written = json.loads(path.read_text())["machine"]
    assert written["cpus"] == os.cpu_count()
    assert written["python"] == platform.python_version()
    assert written["cpu_model"]
    assert benchmarks.describe_machine().startswith(
        f"{os.cpu_count()} CPUs ({written['cpu_model']})"
    )


def run_benchmarks(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks ARGS``, as ``make bench`` runs it."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_runner_make_bench_calls_runs_the_benchmarks_it_is_given() -> None:
    """``make bench`` is this runner: the machine first, then each benchmark
    between its markers, and where its figures went."""
    done = run_benchmarks("--quick", "policy")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"machine: {benchmarks.describe_machine()}"
    assert lines[2] == "== policy (quick)"
    assert "  results: var/bench/policy.quick.json" in lines
    assert lines[-2].startswith("== policy: ") and lines[-2].endswith("s")


def test_the_runner_refuses_a_benchmark_that_does_not_exist() -> None:
    done = run_benchmarks("--quick", "nonesuch")
    assert done.returncode == 2
    there_are = ", ".join(name.removeprefix("bench_") for name in NAMES)
    assert done.stderr.splitlines()[-1] == (
        f"python -m benchmarks: error: no benchmark named nonesuch; there are {there_are}"
    )


def test_the_runner_names_the_benchmarks_that_missed_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missed target fails ``make bench``: the runner goes on with the
    other benchmarks, names the ones that missed last, and exits 1."""
    from benchmarks import __main__ as runner

    ran = []
    for name, met in (("missing", False), ("meeting", True), ("failing", False)):
        module = types.ModuleType(f"benchmarks.bench_{name}")

        def run(quick: bool = False, name: str = name, met: bool = met) -> bool:
            ran.append((name, quick))
            return met

        module.run = run  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(runner, "available", lambda: ["failing", "meeting", "missing"])
    monkeypatch.setattr(sys, "argv", ["benchmarks", "--quick"])

    assert runner.main() == 1
    assert ran == [("failing", True), ("meeting", True), ("missing", True)]
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "missed a target or failed: failing, missing"
