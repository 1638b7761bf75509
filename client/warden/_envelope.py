"""Envelopes: the outcome of an invocation as a value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from warden._errors import CapabilityError

Status = Literal["succeeded", "failed", "suspended", "cancelled"]


@dataclass(frozen=True, slots=True)
class Envelope:
    """The result of ``Runtime.invoke``; governed failures are values, not raises.

    Attributes:
        status: ``succeeded``, ``failed``, ``suspended`` or ``cancelled``.
        output: The validated output model (``succeeded`` only).
        error: The failure (every other status); ``APPROVAL_REQUIRED`` when
            suspended, ``CANCELLED`` when cancelled.
        approval_id: The pending approval's id (``suspended`` only).
        invocation_id: This attempt's id, on every envelope.
        executed_before_failure: The handler ran before the failure, so side
            effects may exist.
        model_output: The output as a model may see it: JSON, without the
            fields marked ``x-warden-model-visible: false`` (``succeeded`` only).
            Adapters hand models this, never ``output``.
        call_id: The logical call: every automatic retry of it is an attempt
            with its own ``invocation_id`` and audit records, all under this id.
        attempt: Which attempt answered, from 1.
        replayed_from: Set when the answer is the recorded outcome of an
            earlier call with the same idempotency key: that call's invocation id.
    """

    status: Status
    invocation_id: str
    output: Any = None
    error: CapabilityError | None = None
    approval_id: str | None = None
    executed_before_failure: bool = False
    model_output: Any = None
    call_id: str = ""
    attempt: int = 1
    replayed_from: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"


def unwrap(envelope: Envelope) -> Any:
    """The envelope's output, or its error raised (``APPROVAL_REQUIRED`` for a
    suspension)."""
    if envelope.status == "succeeded":
        return envelope.output
    assert envelope.error is not None, "a non-successful envelope always carries its error"
    raise envelope.error
