"""The one mapping from what a call raised to what its caller is told: a
designed error says itself, anything else is logged and answered generically."""

from __future__ import annotations

import logging

import grpc
import pytest

from warden_server.errors import Conflict, NotFound
from warden_server.services.status import refusal_of
from warden_server.store import StoreError


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (NotFound("no granted invocation i-1"), grpc.StatusCode.NOT_FOUND),
        (Conflict("another outcome of i-1 was already reported"), grpc.StatusCode.ALREADY_EXISTS),
    ],
)
def test_a_designed_error_is_answered_with_its_status_and_message(
    error: Exception, code: grpc.StatusCode
) -> None:
    assert refusal_of(error, "CompleteMany") == (code, str(error))


def test_a_store_failure_is_unavailable_without_its_text(caplog: pytest.LogCaptureFixture) -> None:
    error = StoreError("disk I/O error at /var/lib/warden")
    assert refusal_of(error, "CompleteMany") == (
        grpc.StatusCode.UNAVAILABLE,
        "the governance store is unavailable",
    )
    assert "disk I/O error" in caplog.text


def test_an_unexpected_error_is_internal_and_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    try:
        raise KeyError("internal detail")
    except KeyError as raised:
        error = raised
    with caplog.at_level(logging.ERROR, logger="warden_server.rpc"):
        code, message = refusal_of(error, "CompleteMany")
    assert (code, message) == (
        grpc.StatusCode.INTERNAL,
        "internal error in the governance plane",
    )
    (record,) = caplog.records
    assert record.getMessage() == "unexpected error in CompleteMany"
    assert record.exc_info is not None and record.exc_info[1] is error
