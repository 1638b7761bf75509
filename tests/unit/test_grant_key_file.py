"""The grant key the plane makes for itself: made once, whole, for its owner alone."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

from warden_server.grants import GrantSigner, default_key_path


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
