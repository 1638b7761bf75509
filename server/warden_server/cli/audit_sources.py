"""Where ``warden audit`` reads: the store file itself, or the plane's audit API.

Both answer with the reader's types (pages of column dicts, stats, verify
results), so the commands format one shape whichever source they read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click
import grpc

from warden.shared.tls import sync_channel
from warden.shared.wire import ACTOR_TOKEN_METADATA, BEARER
from warden.v1 import audit_pb2, audit_pb2_grpc
from warden_server.audit import reader
from warden_server.audit.chain import VerifyResult
from warden_server.audit.checkpoint import CheckpointKeyError, CheckpointVerifier
from warden_server.audit.reader import AuditFilter, Stats
from warden_server.cli.common import rpc_refused
from warden_server.cli.common import tls_credentials as _tls_credentials
from warden_server.errors import RequestError
from warden_server.records.query import Page
from warden_server.services import convert
from warden_server.store import Store

T = TypeVar("T")


class AuditSource(Protocol):
    def query(self, f: AuditFilter, *, limit: int, before: int | None) -> Page: ...

    def stats(self, by: str, f: AuditFilter) -> Stats: ...

    def verify(self) -> VerifyResult: ...

    def export(self, f: AuditFilter) -> Iterator[dict[str, Any]]: ...

    def close(self) -> None: ...


class LocalSource:
    """The store file, read directly: whoever can read the file reads every tenant."""

    def __init__(self, store: Store, key_file: Path | None) -> None:
        self._store = store
        self._key_file = key_file

    def query(self, f: AuditFilter, *, limit: int, before: int | None) -> Page:
        return _local(lambda: reader.query(self._store, f, now=_now(), limit=limit, before=before))

    def stats(self, by: str, f: AuditFilter) -> Stats:
        return _local(lambda: reader.stats(self._store, by, f, now=_now()))

    def verify(self) -> VerifyResult:
        try:
            verifier = CheckpointVerifier.from_file(self._key_file) if self._key_file else None
        except CheckpointKeyError as exc:
            raise click.ClickException(str(exc)) from None
        return _local(lambda: reader.verify(self._store, verifier))

    def export(self, f: AuditFilter) -> Iterator[dict[str, Any]]:
        rows = _local(lambda: reader.export(self._store, f, now=_now()))
        yield from rows

    def close(self) -> None:
        self._store.close()


class RemoteSource:
    """The plane's audit API, as an auditor (``--target`` and ``--token``)."""

    def __init__(self, target: str, token: str, *, timeout_s: float = 30.0) -> None:
        self._target = target
        self._channel = sync_channel(target, _tls_credentials())
        self._stub = audit_pb2_grpc.AuditStub(self._channel)
        self._metadata = ((ACTOR_TOKEN_METADATA, f"{BEARER} {token}"),)
        self._timeout_s = timeout_s

    def query(self, f: AuditFilter, *, limit: int, before: int | None) -> Page:
        request = audit_pb2.QueryRequest(
            filter=convert.audit_filter_to_proto(f),
            limit=limit,
            page_token=str(before) if before is not None else "",
        )
        response = self._call(lambda: self._stub.Query(request, **self._options()))
        return convert.page_from_proto(response)

    def stats(self, by: str, f: AuditFilter) -> Stats:
        request = audit_pb2.StatsRequest(filter=convert.audit_filter_to_proto(f), by=by)
        return convert.stats_from_proto(
            self._call(lambda: self._stub.Stats(request, **self._options()))
        )

    def verify(self) -> VerifyResult:
        request = audit_pb2.VerifyRequest()
        return convert.verify_from_proto(
            self._call(lambda: self._stub.Verify(request, **self._options()))
        )

    def export(self, f: AuditFilter) -> Iterator[dict[str, Any]]:
        request = audit_pb2.ExportRequest(filter=convert.audit_filter_to_proto(f))
        stream = self._call(
            lambda: self._stub.Export(request, metadata=self._metadata, timeout=None)
        )
        try:
            for record in stream:
                yield convert.audit_record_from_proto(record)
        except grpc.RpcError as exc:
            raise self._refused(exc) from None

    def close(self) -> None:
        self._channel.close()

    def _options(self) -> dict[str, Any]:
        return {"metadata": self._metadata, "timeout": self._timeout_s}

    def _call(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except grpc.RpcError as exc:
            raise self._refused(exc) from None

    def _refused(self, exc: grpc.RpcError) -> click.ClickException:
        return rpc_refused(self._target, exc)


def _now() -> datetime:
    return datetime.now(UTC)


def _local(read: Callable[[], T]) -> T:
    """A domain refusal (a bad filter, an unverifiable checkpoint) as one CLI message."""
    try:
        return read()
    except RequestError as exc:
        raise click.ClickException(str(exc)) from None
