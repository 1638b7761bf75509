"""cel-python's parser, made once per machine instead of once per process.

cel-python parses with one Lark LALR parser per process (``CELParser.CEL_PARSER``),
whose tables take about a quarter of a second to compute: every process of a
plane, and every ``warden policy`` command, paid for them at start. The parser
cel-python builds is saved in the user's cache folder and loaded from there
(about 10 ms) by the next process, under a name that changes with the
grammar, cel-python's parser module, Lark and Python, so an upgrade of any of
them builds it afresh.

The saved parser is a pickle, and loading a pickle runs what it says: a file
is loaded only from a folder of this user's alone (``0700``), written by this
user and writable by nobody else. Anything else, or a file that does not
load, is ignored, and the parser is built as cel-python builds it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import stat
import sys
import tempfile
from pathlib import Path

import lark
from celpy import celparser

log = logging.getLogger(__name__)


def cache_folder() -> Path | None:
    """Where the parser is kept: ``$XDG_CACHE_HOME/warden`` (``~/.cache/warden``);
    None for a user without a home folder."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):  # no HOME, and no home in the password database
            return None
    return Path(base) / "warden"


@functools.cache
def ready() -> None:
    """Make cel-python's parser: loaded from the cache, or built and saved there."""
    if celparser.CELParser.CEL_PARSER is not None:
        return
    folder = cache_folder()
    path = folder / f"cel-parser-{_key()}.pickle" if folder is not None else None
    loaded = _load(path) if path is not None else None
    if loaded is not None:
        celparser.CELParser.CEL_PARSER = loaded
        return
    celparser.CELParser()  # builds the parser, as cel-python's Environment would
    if path is not None:
        with contextlib.suppress(OSError):
            _save(path)


def _key() -> str:
    """What the saved parser depends on: the grammar, the module that builds
    it (its options), Lark and Python."""
    digest = hashlib.sha256()
    module = Path(celparser.__file__)
    for part in (module.read_bytes(), (module.parent / "cel.lark").read_bytes()):
        digest.update(hashlib.sha256(part).digest())
    digest.update(f"{lark.__version__} {sys.version_info[:2]}".encode())
    return digest.hexdigest()[:32]


def _load(path: Path) -> lark.Lark | None:
    try:
        file = path.open("rb")
    except OSError:  # none saved yet, or no cache folder to keep one in
        return None
    with file:
        if not (_ours(os.fstat(file.fileno())) and _ours(path.parent.stat())):
            log.warning("%s is not this user's alone: not loaded", path)
            return None
        try:
            return lark.Lark.load(file)
        except Exception as exc:  # damaged: build the parser instead
            log.warning("%s could not be loaded (%s): the parser is built instead", path, exc)
            return None


def _ours(found: os.stat_result) -> bool:
    """Owned by this user and writable by nobody else."""
    return found.st_uid == os.getuid() and not found.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _save(path: Path) -> None:
    """Write the parser beside its final name, then move it there: a process
    reading it meanwhile sees no file or the whole of it."""
    parser = celparser.CELParser.CEL_PARSER
    assert parser is not None
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not _ours(path.parent.stat()):
        return
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".cel-parser-")
    try:
        with os.fdopen(handle, "wb") as file:
            parser.save(file)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
