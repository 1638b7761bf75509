"""Hot reload of the policy folder (SI-12).

A watcher thread waits for changes (watchfiles), then reads the folder once,
checks and compiles it off the request path, and only then swaps it in
whole. A set with any problem never replaces the one in force: it is logged,
shown by ``Policies.GetStatus`` and recorded. Every load and every refusal is
an audit record of kind ``policy`` carrying the revision and the files; the
record of a load is durable before the first decision can use the new set.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

import watchfiles

from warden.shared.canonical import compact_json
from warden_server.config import Config
from warden_server.policy.engine import PolicySet
from warden_server.policy.inputs import InputSchema
from warden_server.policy.loader import (
    PolicyLoadError,
    PolicySource,
    compile_policies,
    read_policy_folder,
)
from warden_server.policy.serving import evaluator_for, serving
from warden_server.policy.testing import registered_capabilities, tests_digest
from warden_server.records.events import AuditEvent
from warden_server.registry import Capability, Registry
from warden_server.store import Store, WriteTransaction

if TYPE_CHECKING:
    from warden_server.plane import PolicyHolder

log = logging.getLogger(__name__)

ReloadResult = Literal["loaded", "rejected", "unchanged"]
MAX_RECORDED_PROBLEMS_CHARS = 16_000
WATCH_STEP_MS = 10
FOLDER_CHECK_MS: Final = 1_000
"""How often the watcher checks that the folder it watches is still the one at
its path: one swapped in whole (``mv new policies``) is watched from then on."""
"""How often the folder's watcher looks at its stop signal: the longest a
plane's shutdown waits for it. Each look is a few microseconds."""


def input_schemas(versions: Sequence[Capability]) -> list[InputSchema]:
    """The input schema of every registered capability version, for the checker
    (a pinned older version can still be called)."""
    return [InputSchema(c.id, c.definition.input_schema, c.version) for c in versions]


def load_at_start(
    config: Config, store: Store, registry: Registry, *, joining: bool = False
) -> PolicySet:
    """The policy set a plane starts with, its loading (or refusal) recorded.

    A process ``joining`` a plane loads while the plane's first process loads
    and records nothing yet: it announces its set once the first process has
    recorded its own (``announce_joined``). At the plane's start, one that
    cannot load its set does not start, and neither does the plane: the first
    process records the refusal. One started later in place of a process that
    ended is tried again instead (``processes.py``); hot reload recorded the
    refusal of the folder it cannot load.

    Raises:
        PolicyLoadError: the folder has problems; the plane must not start.
    """
    try:
        source = read_policy_folder(config.policies_path)
        policies = _compile(config, source, registry)
    except PolicyLoadError as exc:
        if not joining:
            _record_rejection(store, exc, serving=None, reason="startup")
        raise
    if not joining:
        _record_load(store, policies, previous=None, reason="startup")
    return policies


def announce_joined(store: Store, policies: PolicySet) -> None:
    """Record the set a joining process loaded, unless the log announces it
    already (the plane's first process has, unless the folder changed while
    they loaded): a revision is announced before any process decides with it."""
    _record_load(store, policies, previous=None, reason="startup", unless_announced=True)


class PolicyReloader:
    """Keeps a plane's policy set in step with its folder."""

    def __init__(
        self,
        config: Config,
        store: Store,
        registry: Registry,
        holder: PolicyHolder,
        *,
        shared: bool = False,
    ) -> None:
        self._shared = shared
        """Other processes serve the same folder and store: a revision one of
        them announced already is not announced again."""
        self._config = config
        self._store = store
        self._registry = registry
        self._holder = holder
        self._directory = Path(config.policies_path).absolute()
        self._lock = threading.Lock()
        self._refused_tests = ""
        """The digest of the test files when the last change was refused: with
        ``require_passing_tests`` a fixed test alone can lift the refusal."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def watching(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def reload(self) -> ReloadResult:
        """Read the folder; if it changed, check, compile and swap it in whole.

        A folder that matches the set in force, or the change last refused,
        is ``unchanged``: nothing is compiled or recorded again.
        """
        with self._lock:
            status = self._holder.status()
            try:
                source = read_policy_folder(self._directory)
            except PolicyLoadError as exc:
                return self._refuse(exc)
            if source.revision == status.current.revision:
                if status.rejected is not None:
                    self._holder.settle()
                return "unchanged"
            if (
                status.rejected is not None
                and source.revision == status.rejected.revision
                and self._tests_digest() == self._refused_tests
            ):
                return "unchanged"
            try:
                policies = _compile(self._config, source, self._registry, status.current)
            except PolicyLoadError as exc:
                return self._refuse(exc)
            # Durable first: no decision can name a revision the log has not announced.
            _record_load(
                self._store,
                policies,
                previous=status.current,
                reason="reload",
                unless_announced=self._shared,
            )
            self._holder.swap(policies, _now())
            log.info(
                "policy set %s loaded (%d rules in %s)",
                policies.revision[:12],
                len(policies.rules),
                ", ".join(policies.files) or "no files",
            )
            return "loaded"

    def _tests_digest(self) -> str:
        """What the folder's tests are, when they gate a set (else nothing)."""
        if not self._config.policies.require_passing_tests:
            return ""
        return tests_digest(self._directory)

    def _refuse(self, error: PolicyLoadError) -> ReloadResult:
        status = self._holder.status()
        self._refused_tests = self._tests_digest()
        if status.rejected is not None and (status.rejected.revision, status.rejected.problems) == (
            error.revision,
            tuple(error.problems),
        ):
            return "unchanged"
        serving = status.current
        _record_rejection(
            self._store, error, serving=serving, reason="reload", unless_announced=self._shared
        )
        self._holder.reject(error.revision, error.files, error.problems, _now())
        log.error("policy change refused; still serving %s:\n%s", serving.revision[:12], error)
        return "rejected"

    def start(self) -> None:
        """Watch the folder on a background thread until ``stop``."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._watch, name="warden-policy-watch", daemon=True)
        self._thread.start()

    def stopping(self) -> None:
        """Tell the watcher to stop, without waiting: it notices within one
        step of its poll (``WATCH_STEP_MS``), which the rest of a shutdown can overlap."""
        self._stop.set()

    def stop(self) -> None:
        """Stop watching, and wait until the watcher has."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _watch(self) -> None:
        # The tests gate a set when they must pass; otherwise editing them changes nothing.
        tests_gate = self._config.policies.require_passing_tests
        ignore = watchfiles.DefaultFilter(
            ignore_paths=[] if tests_gate else [self._directory / "tests"]
        )
        while not self._stop.is_set():
            watched = _identity(self._directory)
            try:
                for changes in watchfiles.watch(
                    self._directory,
                    watch_filter=ignore,
                    debounce=self._config.server.policy_debounce_ms,
                    step=min(WATCH_STEP_MS, self._config.server.policy_debounce_ms),
                    stop_event=self._stop,
                    raise_interrupt=False,
                    rust_timeout=FOLDER_CHECK_MS,
                    yield_on_timeout=True,
                ):
                    if changes:
                        self._reload_logged()
                    if _identity(self._directory) != watched:
                        # Replaced whole: the watch follows the old folder.
                        log.info("%s was replaced; watching the new folder", self._directory)
                        break
            except Exception as exc:
                # The folder vanished or cannot be watched: retry, and meanwhile
                # record what the folder now is.
                log.warning("cannot watch %s (%s); retrying", self._directory, exc)
            if self._stop.wait(1.0):
                break
            self._reload_logged()

    def _reload_logged(self) -> None:
        try:
            self.reload()
        except Exception:
            # The set in force stays; the watcher must outlive any one failure.
            log.exception("policy reload failed; the set in force stays")


def _identity(folder: Path) -> tuple[int, int] | None:
    """Which folder is at ``folder`` now (device and inode), if any."""
    try:
        found = folder.stat()
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _compile(
    config: Config, source: PolicySource, registry: Registry, in_force: PolicySet | None = None
) -> PolicySet:
    with collector_paused():
        return _compile_now(config, source, registry, in_force)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a policy set compiles. Compiling
    makes hundreds of thousands of objects that live (the set) or die by
    reference count alone, and each collection the allocations trigger walks
    the set made so far again: a quarter of a 5,000-rule compile. Garbage
    left in cycles meanwhile is collected once the collector runs again."""
    if not gc.isenabled():  # paused already (another compile), or off for good
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _compile_now(
    config: Config, source: PolicySource, registry: Registry, in_force: PolicySet | None
) -> PolicySet:
    versions = registry.every_version()
    compiled = compile_policies(
        source,
        default_effect=config.server.default_effect,
        evaluator=evaluator_for(config.server.evaluator),
        capabilities=input_schemas(versions),
        reuse=in_force,
    )
    served, failing = serving(
        compiled,
        source.directory,
        require_passing_tests=config.policies.require_passing_tests,
        capabilities=registered_capabilities(
            {**c.to_cel(), "input_schema": c.definition.input_schema} for c in versions
        ),
    )
    if failing:
        raise PolicyLoadError(failing, source.revision, source.names)
    return served


def _record_load(
    store: Store,
    policies: PolicySet,
    *,
    previous: PolicySet | None,
    reason: str,
    unless_announced: bool = False,
) -> None:
    details = {
        "files": list(policies.files),
        "rules": len(policies.rules),
        "previous_revision": previous.revision if previous else None,
        "evaluator": policies.evaluator.name,
    }
    event = AuditEvent(
        kind="policy",
        status="loaded",
        policy_revision=policies.revision,
        reason=reason,
        details=compact_json(details),
    )

    def work(tx: WriteTransaction) -> None:
        if unless_announced and tx.last_policy_event() == ("loaded", policies.revision):
            return
        tx.append_audit(event)

    store.transact(work)


def _record_rejection(
    store: Store,
    error: PolicyLoadError,
    *,
    serving: PolicySet | None,
    reason: str,
    unless_announced: bool = False,
) -> None:
    details = {
        "files": list(error.files),
        "problems": len(error.problems),
        "serving_revision": serving.revision if serving else None,
    }
    event = AuditEvent(
        kind="policy",
        status="rejected",
        policy_revision=error.revision or None,
        reason=reason,
        details=compact_json(details),
        cause_type=type(error).__name__,
        cause_message=str(error)[:MAX_RECORDED_PROBLEMS_CHARS],
    )

    def work(tx: WriteTransaction) -> None:
        if unless_announced and tx.last_policy_event() == ("rejected", error.revision or None):
            return
        tx.append_audit(event)

    store.transact(work)


def _now() -> datetime:
    return datetime.now(UTC)
