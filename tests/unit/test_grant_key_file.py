"""The grant key the plane makes for itself: made once, whole, for its owner alone,
or a clear word of what stands in the way."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest

from warden_server.grants import GrantSigner, default_key_path
from warden_server.keyfiles import KeyFileError
from warden_server.store import StoreError
from warden_server.store.sqlite import SQLiteStore


def test_the_default_key_is_beside_the_store() -> None:
    assert default_key_path(Path("var/warden.db")) == Path("var/warden.db.grant-key")


def test_planes_starting_together_on_one_store_sign_with_one_key(tmp_path: Path) -> None:
    path = default_key_path(tmp_path / "warden.db")
    key_ids: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def start_a_plane() -> None:
        start.wait()
        signer = GrantSigner.from_files(path, create=True)
        with lock:
            key_ids.append(signer.key_id)

    threads = [threading.Thread(target=start_a_plane) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(key_ids)) == 1
    assert GrantSigner.from_files(path, create=True).key_id == key_ids[0]  # and at every start
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("below", ["", "deeper/"], ids=["in-the-file", "below-the-file"])
def test_a_key_beside_a_store_under_a_file_names_the_file_in_the_way(
    tmp_path: Path, below: str
) -> None:
    (tmp_path / "taken").write_text("a file, not a folder\n")
    path = default_key_path(tmp_path / "taken" / below / "warden.db")
    with pytest.raises(KeyFileError) as raised:
        GrantSigner.from_files(path, create=True)
    assert str(raised.value) == (
        f"{path}: cannot write the key file: {tmp_path / 'taken'} is a file, not a folder"
    )


def test_a_store_under_a_file_names_the_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file, not a folder\n")
    store = tmp_path / "taken" / "warden.db"
    with pytest.raises(StoreError) as raised:
        SQLiteStore(store)
    assert str(raised.value) == (
        f"{store}: cannot open the store: {tmp_path / 'taken'} is a file, not a folder"
    )
