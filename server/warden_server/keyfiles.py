"""Keys the plane makes for itself and keeps beside its store.

A plane that is given no key of its own (grant signing, row integrity,
replay sealing) makes one the first time it starts and reads it at every
start after, so that what it signed, sealed or MAC'd before a restart is
still its own. Each key file is readable by its owner alone (0600) and is
written whole before it appears: planes and processes starting together on
one store all end up with the one file that was linked first.
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
from pathlib import Path


class KeyFileError(ValueError):
    """A key file cannot be used; the message names it and says why."""


def beside(store: Path, name: str) -> Path:
    """Where the key ``name`` of the plane serving ``store`` lives."""
    return store.with_name(f"{store.name}.{name}")


def write_once(path: Path, content: bytes) -> bool:
    """Write ``content`` to ``path`` (mode 0600) unless the file exists;
    whether this call made it.

    Raises:
        KeyFileError: the folder cannot be made or written (the message says why).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot write the key file: {why_not_written(exc)}") from None
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False  # another process made it first: its key is the key
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot write the key file: {why_not_written(exc)}") from None
    finally:
        os.unlink(temporary)
    return True


def why_not_written(exc: OSError) -> str:
    """Why a file could not be made, in a few words. Where a file stands in
    place of a folder of the path, ``mkdir`` says "file exists" or "not a
    directory" of a path that is not the culprit: name the file instead."""
    if isinstance(exc, FileExistsError | NotADirectoryError) and exc.filename:
        blocking = Path(os.fsdecode(exc.filename))
        while not blocking.exists() and blocking != blocking.parent:
            blocking = blocking.parent
        if blocking.exists() and not blocking.is_dir():
            return f"{blocking} is a file, not a folder"
    return (exc.strerror or str(exc)).lower()


def read_private(path: Path) -> bytes:
    """The content of a key file that only its owner may read.

    Raises:
        KeyFileError: the file cannot be read, or others may read it.
    """
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        content = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"{path}: {exc.strerror or exc}") from None
    if mode & 0o077:
        raise KeyFileError(f"{path}: a key file must be readable by its owner only (0600)")
    return content


def hex_key(path: Path, *, create: bool, size: int = 32) -> bytes | None:
    """The ``size``-byte key kept in ``path`` as hex digits: made first when the
    file is missing and ``create``; None when it is missing and not ``create``.

    Raises:
        KeyFileError: the file cannot be read or written, others may read it,
            or it does not hold such a key.
    """
    if not path.exists():
        if not create:
            return None
        write_once(path, secrets.token_bytes(size).hex().encode("ascii") + b"\n")
    content = read_private(path)
    try:
        key = bytes.fromhex(content.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != size:
        raise KeyFileError(f"{path}: not a key ({size * 2} hex digits)")
    return key
