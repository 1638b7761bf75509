"""Shared fixtures: a real plane on an ephemeral port, a real SQLite file,
real CEL policies and real JWTs."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from warden_server.app import Server, launch
from warden_server.auth.actors import mint_token
from warden_server.config import Config, config_from_dict, load_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_POLICIES = ROOT / "policies"
ORDERS_TOKEN = "test-orders-token"
BILLING_TOKEN = "test-billing-token"
ACTOR_SECRET = "test-only-actor-secret-0123456789abcdef"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="Rewrite golden files (tests/testdata/**/expected.txt, tests/adapters/golden/) "
        "from the current output.",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """Whether golden files are rewritten instead of compared."""
    return bool(request.config.getoption("--update-golden"))


def load_example(name: str = "orders") -> ModuleType:
    """Import examples/<name>/service.py (examples are not an installed package)."""
    path = ROOT / "examples" / name / "service.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}_service", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session", autouse=True)
def cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The cache folder of the run, where cel-python's parser is saved once and
    loaded by every plane the tests start (``policy.grammar``): the run's own,
    shared by its workers, never the user's."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if base.name.startswith("popen-gw") else base) / "cache"
    kept = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(folder)  # the planes started as processes inherit it
    try:
        yield folder
    finally:
        if kept is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = kept


@pytest.fixture(autouse=True)
def outbox_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The state folder of the test's runtimes, where their outboxes are by default
    (``$XDG_STATE_HOME/warden/``): the test's own, never the user's."""
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


def _process_counts(text: str) -> tuple[int, ...]:
    counts = tuple(int(n) for n in text.split(",") if n.strip().isdigit() and int(n) > 0)
    if len(counts) != len(text.split(",")):
        raise pytest.UsageError(
            f"WARDEN_TEST_PROCESSES={text!r}: give process counts separated by commas, as 1,2"
        )
    return counts


PROCESS_COUNTS = _process_counts(os.environ.get("WARDEN_TEST_PROCESSES", "1"))
"""How many processes the test planes serve with: ``WARDEN_TEST_PROCESSES``,
one count or several (``make test`` gives ``1,2``). With several, every
integration and console test whose planes take their count from here runs
once per count, as variants ``[1proc]``, ``[2proc]``; the others run once,
with the first count."""

PER_COUNT_FOLDERS = (ROOT / "tests" / "integration", ROOT / "tests" / "console")

ONE_PROCESS_FIXTURES = frozenset({"clock"})
"""Fixtures whose planes are one process whatever the count: a plane on the
guarantees' test clock (see ``launch`` in tests/integration/guarantees)."""

_running = {"processes": PROCESS_COUNTS[0]}


def processes() -> int:
    """How many processes the running test's planes serve with."""
    return _running["processes"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each test whose planes take the count from ``processes()`` once per count."""
    if len(PROCESS_COUNTS) < 2:
        return
    definition = metafunc.definition
    if not any(definition.path.is_relative_to(folder) for folder in PER_COUNT_FOLDERS):
        return
    if any(next(definition.iter_markers(m), None) for m in ("single_process", "fixed_processes")):
        return
    if ONE_PROCESS_FIXTURES & set(metafunc.fixturenames):
        return
    metafunc.parametrize(
        "plane_processes", PROCESS_COUNTS, indirect=True, ids=[f"{n}proc" for n in PROCESS_COUNTS]
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the tests marked ``heavy`` first, the rest in their order.

    The workers take the collection in slices, in order, and an idle one
    steals from the end of the busiest's queue: a heavy test at the end of a
    file met late ran alone while the other workers had finished (a kill and
    restart under load, 15 s after the rest of the suite).
    """
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


@pytest.fixture(autouse=True)
def plane_processes(request: pytest.FixtureRequest) -> Iterator[int]:
    """The count of this test (or variant) for ``processes()``."""
    _running["processes"] = getattr(request, "param", PROCESS_COUNTS[0])
    yield _running["processes"]
    _running["processes"] = PROCESS_COUNTS[0]


def make_config(tmp_path: Path, policies: Path = EXAMPLE_POLICIES, **server: Any) -> Config:
    return config_from_dict(
        {
            "server": {
                "listen": "127.0.0.1:0",
                "store": str(tmp_path / "warden.db"),
                "policies": str(policies),
                "processes": processes(),
                **server,
            },
            "actors": {"hs256_secret": ACTOR_SECRET, "issuer": "warden-test", "audience": "warden"},
            "services": {
                "orders": {"token": ORDERS_TOKEN, "namespaces": ["orders"]},
                "billing": {"token": BILLING_TOKEN, "namespaces": ["billing"]},
            },
        },
        base_dir=tmp_path,
    )


class Plant:
    """A running plane and what tests need around it."""

    def __init__(self, server: Server, tmp_path: Path) -> None:
        self.server = server
        self.tmp_path = tmp_path

    @property
    def target(self) -> str:
        return self.server.target

    @property
    def config(self) -> Config:
        return self.server.plane.config

    @property
    def db_path(self) -> Path:
        return self.config.store_path

    def token(
        self,
        sub: str = "bot-7",
        roles: tuple[str, ...] = ("support",),
        tenant: str = "acme",
        ttl: int = 600,
        **attrs: Any,
    ) -> str:
        return mint_token(
            self.config, subject=sub, roles=roles, tenant=tenant, attrs=attrs, ttl_seconds=ttl
        )

    def rows(
        self, sql: str = "SELECT * FROM audit_events ORDER BY seq", params: tuple[Any, ...] = ()
    ) -> list[dict[str, Any]]:
        """Read the store through a separate connection, as a security team would,
        once the outcome reports of the test's runtimes have arrived."""
        self.await_outcome_reports()
        conn = sqlite3.connect(self.db_path)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(sql, params)]
        finally:
            conn.close()

    def await_outcome_reports(self, timeout_s: float = 10.0) -> None:
        """Wait until the outboxes in the test's state folder (where runtimes keep
        them by default) hold no report for this plane that it has not refused.

        A runtime hands an outcome to its outbox and answers its caller at once;
        the plane records it moments later. A plane that stays away is waited
        for ``timeout_s`` at most, and the store is read as it is.
        """
        deadline = time.monotonic() + timeout_s
        for outbox in sorted((self.tmp_path / "state" / "warden").glob("outbox-*.sqlite")):
            while time.monotonic() < deadline and _reports_waiting(outbox, self.target):
                time.sleep(0.005)

    def events(self, **where: Any) -> list[dict[str, Any]]:
        rows = self.rows()
        return [r for r in rows if all(r[k] == v for k, v in where.items())]

    def rpc_calls(self, method: str) -> float:
        """Calls of ``method`` (``warden.v1.Governor/Complete``) answered by this
        plane's first process: the whole plane in a test marked ``single_process``."""
        total = 0.0
        for family in self.server.plane.telemetry.metrics.registry.collect():
            for sample in family.samples:
                if (
                    sample.name == "warden_rpc_duration_seconds_count"
                    and sample.labels.get("method") == method
                ):
                    total += sample.value
        return total


def _reports_waiting(outbox: Path, target: str) -> int:
    conn = sqlite3.connect(outbox, timeout=10)
    try:
        row = conn.execute(
            "SELECT count(*) FROM reports WHERE target = ? AND refusal IS NULL", (target,)
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


def one_process(request: pytest.FixtureRequest) -> dict[str, Any]:
    """``[server]`` keys for a test marked ``single_process``: it reaches into the
    plane's memory (a test clock, the store's writer), which only the first of
    several processes would see."""
    return {"processes": 1} if request.node.get_closest_marker("single_process") else {}


@pytest.fixture
def start_plane(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Plant]]:
    """Start planes on ephemeral ports; every one is stopped at teardown."""
    servers: list[Server] = []

    def start(policies: Path = EXAMPLE_POLICIES, **server: Any) -> Plant:
        config = make_config(tmp_path, policies, **{**one_process(request), **server})
        running = launch(config)
        servers.append(running)
        return Plant(running, tmp_path)

    yield start
    for running in servers:
        running.stop(grace=0)


@pytest.fixture
def dev_plane(tmp_path: Path) -> Iterator[Server]:
    """A plane served from the repository's own warden.toml (with a store of its own)."""
    config = load_config(
        ROOT / "warden.toml",
        environ={},
        overrides={
            "listen": "127.0.0.1:0",
            "store": str(tmp_path / "warden.db"),
            "processes": str(processes()),
        },
    )
    # The metrics port of warden.toml may be taken by a plane from `make run`.
    config = config.model_copy(
        update={"telemetry": config.telemetry.model_copy(update={"metrics_listen": None})}
    )
    server = launch(config)
    yield server
    server.stop(grace=0)


@pytest.fixture
def plant(start_plane: Callable[..., Plant]) -> Plant:
    """The plane with the example policies."""
    return start_plane()


@pytest.fixture
def orders_example() -> ModuleType:
    return load_example("orders")


@pytest.fixture
def orders(plant: Plant, orders_example: ModuleType) -> Iterator[Any]:
    """The example orders service's runtime, registered with the plane."""
    rt = orders_example.build_runtime(plant.target, ORDERS_TOKEN)
    rt.register()
    yield rt
    rt.close()


@pytest.fixture
def policy_dir(tmp_path: Path) -> Callable[[str], Path]:
    """Write a policy folder with one file of the given YAML."""
    counter = iter(range(1000))

    def write(text: str) -> Path:
        folder = tmp_path / f"policies-{next(counter)}"
        folder.mkdir()
        (folder / "rules.yaml").write_text(text)
        return folder

    return write


def copy_policies(dest: Path) -> Path:
    shutil.copytree(EXAMPLE_POLICIES, dest)
    return dest


@pytest.fixture
def lab_plant(start_plane: Callable[..., Plant], tmp_path: Path) -> Plant:
    """A plane with the laboratory policies."""
    from tests.integration.lab import write_lab_policies

    return start_plane(write_lab_policies(tmp_path / "lab-policies"))


@pytest.fixture
def lab() -> Any:
    from tests.integration.lab import Lab

    return Lab()


@pytest.fixture
def lab_rt(lab_plant: Plant, lab: Any) -> Iterator[Any]:
    from tests.integration.lab import build_lab

    rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab)
    rt.register()
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A throw-away PostgreSQL server for this test worker (see tests/postgres.py)."""
    from tests import postgres

    bin_dir = postgres.binaries()
    if bin_dir is None:
        postgres.unavailable("no initdb (Debian: apt-get install postgresql)")
    assert bin_dir is not None
    server = postgres.Server(bin_dir)
    try:
        server.start()
    except (OSError, subprocess.SubprocessError) as exc:
        server.stop()
        postgres.unavailable(f"it would not start: {exc}")
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server: Any) -> str:
    """A fresh, empty database on the test worker's PostgreSQL server."""
    return str(postgres_server.fresh_database())
