"""Where the tests find PostgreSQL's server binaries on a fresh machine."""

from __future__ import annotations

from pathlib import Path

from tests.postgres import binaries


def install(root: Path, version: str) -> Path:
    folder = root / "usr/lib/postgresql" / version / "bin"
    folder.mkdir(parents=True)
    for name in ("initdb", "pg_ctl", "postgres"):
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return folder


def test_debians_binaries_are_found_off_the_path_newest_version_first(tmp_path: Path) -> None:
    install(tmp_path, "9.6")
    newest = install(tmp_path, "15")
    install(tmp_path, "13")
    empty = tmp_path / "empty-path"
    empty.mkdir()
    debian = str(tmp_path / "usr/lib/postgresql/*/bin/initdb")
    assert binaries(path=str(empty), debian=debian) == newest


def test_an_initdb_on_the_path_is_followed_to_the_folder_of_all_three(tmp_path: Path) -> None:
    real = install(tmp_path, "15")
    on_path = tmp_path / "local-bin"
    on_path.mkdir()
    (on_path / "initdb").symlink_to(real / "initdb")
    assert binaries(path=str(on_path), debian=str(tmp_path / "none/*/initdb")) == real


def test_no_binaries_anywhere_is_none(tmp_path: Path) -> None:
    assert binaries(path=str(tmp_path), debian=str(tmp_path / "none/*/initdb")) is None
