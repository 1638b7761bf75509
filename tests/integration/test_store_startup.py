"""Starting the store: several planes at once on a fresh file, and store
values that are not a SQLite file."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import make_config
from tests.integration.store_opener import open_store
from warden_server.config import ConfigError, config_from_dict
from warden_server.store import SQLiteStore, StoreError
from warden_server.store.migrations import MIGRATIONS

# These open stores and read configs; no plane here is served with the count
# of WARDEN_TEST_PROCESSES, so they run once whatever counts it lists.
pytestmark = pytest.mark.fixed_processes

STARTERS = 6


def test_planes_starting_together_on_a_fresh_file_migrate_it_once(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(STARTERS)
    starters = [
        context.Process(target=open_store, args=(str(path), start)) for _ in range(STARTERS)
    ]
    for process in starters:
        process.start()
    for process in starters:
        process.join(timeout=60)
    assert [p.exitcode for p in starters] == [0] * STARTERS
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    finally:
        conn.close()


@pytest.mark.parametrize("store", ["mysql://db", "sqlite:x.db", "postgresq://db/warden"])
def test_an_unsupported_store_url_is_a_clear_config_error_not_a_relative_path(
    tmp_path: Path, store: str
) -> None:
    base = make_config(tmp_path).model_dump()
    base["server"]["store"] = store
    with pytest.raises(ConfigError) as raised:
        config_from_dict(base, base_dir=tmp_path)
    assert f"store {store!r} names a" in str(raised.value)
    assert "postgresql:// URL" in str(raised.value)
    assert not any(tmp_path.iterdir()), "nothing may be created for a refused store"


@pytest.mark.parametrize("store", ["postgresql://warden@db/warden", "postgres://db/warden"])
def test_a_postgresql_url_is_a_store(tmp_path: Path, store: str) -> None:
    base = make_config(tmp_path).model_dump()
    base["server"]["store"] = store
    config = config_from_dict(base, base_dir=tmp_path)
    assert config.store_url == store
    assert config.store_path == tmp_path / "var" / "warden"


@pytest.mark.parametrize(
    "store", ["postgresql://warden:secret@db/warden", "postgresql://db/warden?password=secret"]
)
def test_a_password_in_the_store_url_is_refused(tmp_path: Path, store: str) -> None:
    base = make_config(tmp_path).model_dump()
    base["server"]["store"] = store
    with pytest.raises(ConfigError) as raised:
        config_from_dict(base, base_dir=tmp_path)
    assert "PGPASSWORD" in str(raised.value)
    assert "secret" not in str(raised.value)


def test_a_file_that_is_not_a_database_is_refused_and_nothing_is_left_beside_it(
    tmp_path: Path,
) -> None:
    """A store path naming some other file (a typo in the config) is refused
    before the writers' lock file is made beside it, and the file is untouched."""
    path = tmp_path / "warden.db"
    path.write_text("not a database at all\n")
    with pytest.raises(StoreError, match="file is not a database"):
        SQLiteStore(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warden.db"]
    assert path.read_text() == "not a database at all\n"
