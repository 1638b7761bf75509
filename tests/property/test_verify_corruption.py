"""``warden audit verify`` on a store file with damaged pages never crashes: it
answers ok, TAMPERED (exit 1) or CORRUPT (exit 2), always in one plain line."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warden_server.cli import main
from warden_server.records.events import AuditEvent
from warden_server.store import SQLiteStore, WriteTransaction

PAGE = 4096
RECORDS = 600


@pytest.fixture(scope="module")
def store_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store of a few hundred records, spread over some dozens of pages."""
    path = tmp_path_factory.mktemp("verify") / "warden.db"
    store = SQLiteStore(path)

    def work(tx: WriteTransaction) -> None:
        for i in range(RECORDS):
            tx.append_audit(
                AuditEvent(
                    kind="decision",
                    status="granted" if i % 3 else "failed",
                    invocation_id=f"inv-{i:05d}",
                    capability_id=f"orders.op{i % 7}",
                    actor_id=f"actor-{i % 11}",
                    tenant="acme" if i % 2 else "globex",
                    input=json.dumps({"order_id": f"A{i}", "amount": i * 3}),
                )
            )

    store.transact(work)
    store.close()
    return path


def verify(path: Path) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(main, ["audit", "verify", "--store", str(path)])
    unexpected = None if isinstance(result.exception, SystemExit) else result.exception
    return result.exit_code, result.output, unexpected


def test_an_intact_store_verifies(store_file: Path) -> None:
    code, output, unexpected = verify(store_file)
    assert (code, unexpected) == (0, None), output
    assert output.startswith(f"ok: {RECORDS} records")


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_verify_never_crashes_on_a_damaged_page(store_file: Path, data: st.DataObject) -> None:
    pages = store_file.stat().st_size // PAGE
    page = data.draw(st.integers(0, pages - 1), label="page")
    offset = data.draw(st.integers(0, PAGE - 1), label="offset")
    garbage = data.draw(st.binary(min_size=1, max_size=PAGE), label="garbage")
    with tempfile.TemporaryDirectory() as folder:
        damaged = Path(folder) / "warden.db"
        shutil.copyfile(store_file, damaged)
        with damaged.open("r+b") as file:
            file.seek(page * PAGE + offset)
            file.write(garbage[: PAGE - offset])
        code, output, unexpected = verify(damaged)
    assert unexpected is None, f"verify crashed: {unexpected!r}"
    assert "Traceback" not in output
    assert code in (0, 1, 2), output
    verdict = {0: "ok: ", 1: "TAMPERED", 2: "CORRUPT: "}[code]
    first, *notes = output.strip().splitlines()
    assert first.startswith(verdict), output
    assert all(note.startswith("not proven without an anchor: ") for note in notes), output


def test_a_file_that_is_not_a_database_is_corrupt_not_a_crash(tmp_path: Path) -> None:
    damaged = tmp_path / "warden.db"
    damaged.write_bytes(b"\x00garbage" * 1000)
    code, output, unexpected = verify(damaged)
    assert (code, unexpected) == (2, None), output
    assert output.startswith("CORRUPT: ") and "cannot be read as a SQLite database" in output
