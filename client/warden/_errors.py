"""The two-face error: a model-safe public face and a private diagnostic body."""

from __future__ import annotations

import copy
from typing import Any

from warden.shared.codes import CODES, CONCEALED_CODE, CONCEALED_MESSAGE


class CapabilityError(Exception):
    """A failure of a governed invocation.

    Attributes:
        code: Stable and machine-readable: a built-in code or a declared one.
        stage: Where the pipeline failed (``discovery``, ``policy``, ...).
        public_message: Written for models and end users.
        retryable: Whether an identical request could succeed later.
        expose_to_model: Whether code and public message may cross the
            adapter boundary; when False a model sees only the concealed shape.
        details: Model-safe structured data, or None.
        cause: The real error, for logs and the audit store only; it is never
            serialized outward.
    """

    code: str
    stage: str
    public_message: str
    retryable: bool
    expose_to_model: bool
    details: dict[str, Any] | None
    cause: BaseException | None

    def __init__(
        self,
        code: str,
        public_message: str | None = None,
        *,
        stage: str | None = None,
        retryable: bool | None = None,
        expose_to_model: bool | None = None,
        details: dict[str, Any] | None = None,
        cause: BaseException | None = None,
    ) -> None:
        known = CODES.get(code)
        self.code = code
        self.stage = stage or (known.stage if known else "execution")
        self.public_message = public_message or (
            known.public_message if known else CONCEALED_MESSAGE
        )
        self.retryable = retryable if retryable is not None else bool(known and known.retryable)
        self.expose_to_model = (
            expose_to_model if expose_to_model is not None else (known.exposed if known else True)
        )
        self.details = details
        self.cause = cause
        super().__init__(f"{self.code} ({self.stage}): {self.public_message}")

    def to_model(self) -> dict[str, Any]:
        """The only shapes a model ever sees (SI-9).

        Exposed: ``{"code", "message", "retryable"}`` plus ``"details"`` when
        present. Concealed: exactly ``{"code": "INTERNAL_ERROR", "message":
        "The operation failed."}``.
        """
        if not self.expose_to_model:
            return {"code": CONCEALED_CODE, "message": CONCEALED_MESSAGE}
        shape: dict[str, Any] = {
            "code": self.code,
            "message": self.public_message,
            "retryable": self.retryable,
        }
        if self.details:
            shape["details"] = copy.deepcopy(self.details)
        return shape

    def __repr__(self) -> str:
        return (
            f"CapabilityError(code={self.code!r}, stage={self.stage!r}, "
            f"public_message={self.public_message!r}, retryable={self.retryable!r}, "
            f"expose_to_model={self.expose_to_model!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickling crosses process boundaries: the private cause stays behind.
        return (
            _rebuild,
            (
                self.code,
                self.public_message,
                self.stage,
                self.retryable,
                self.expose_to_model,
                self.details,
            ),
        )


def _rebuild(
    code: str,
    public_message: str,
    stage: str,
    retryable: bool,
    expose_to_model: bool,
    details: dict[str, Any] | None,
) -> CapabilityError:
    return CapabilityError(
        code,
        public_message,
        stage=stage,
        retryable=retryable,
        expose_to_model=expose_to_model,
        details=details,
    )


class WardenError(Exception):
    """A developer-facing error of the SDK itself: bad definitions, refused
    registration, bad configuration. Never raised for a governed invocation.

    Attributes:
        transient: the plane could not be reached, so trying again may work.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class ApprovalError(WardenError):
    """The plane refused an approver's request, or could not be reached.

    Attributes:
        status: The gRPC status name, e.g. ``PERMISSION_DENIED`` (the requester
            or an approver the rule does not allow), ``NOT_FOUND``,
            ``FAILED_PRECONDITION`` (expired or already decided),
            ``UNAUTHENTICATED`` or ``UNAVAILABLE``.
    """

    def __init__(self, status: str, message: str, *, transient: bool = False) -> None:
        super().__init__(message, transient=transient)
        self.status = status
