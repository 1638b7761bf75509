"""The one translation of an envelope into what a model is told.

Adapters never unwrap an envelope and never look past the public face of an
error (SI-10): a success is the output as a model may see it
(``Envelope.model_output``, without the fields marked model-hidden), and every
other status is the error's ``to_model()`` shape, one of exactly two (SI-9).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from warden._envelope import Envelope
from warden._errors import CapabilityError
from warden.shared.canonical import compact_json

CONCEALMENT_CODE: Final = "CAPABILITY_NOT_FOUND"
"""The code of the concealment class: unknown, unexposed and hidden alike (SI-8)."""


@dataclass(frozen=True, slots=True)
class ModelAnswer:
    """What a model is told about one call.

    Attributes:
        value: The output (``succeeded``) or the model-safe error shape
            (``failed``, ``suspended`` and ``cancelled``).
        is_error: The call produced no output.
    """

    value: Any
    is_error: bool

    @property
    def conceals_capability(self) -> bool:
        """The capability is not there for this actor on this surface, or must
        appear not to be: the plane answers all three cases identically."""
        return self.is_error and self.value.get("code") == CONCEALMENT_CODE

    @property
    def text(self) -> str:
        """The value as compact, key-sorted JSON: the same bytes for the same answer."""
        return compact_json(self.value)


def answer(envelope: Envelope) -> ModelAnswer:
    """Translate an envelope of any of the four statuses."""
    if envelope.status == "succeeded":
        return _keys_sorted(envelope.model_output, is_error=False)
    assert envelope.error is not None, "a non-successful envelope always carries its error"
    return _keys_sorted(envelope.error.to_model(), is_error=True)


def refusal(error: CapabilityError) -> ModelAnswer:
    """An error raised outside an envelope (discovery), as a model may see it."""
    return _keys_sorted(error.to_model(), is_error=True)


def _keys_sorted(value: Any, *, is_error: bool) -> ModelAnswer:
    # Structured values keep the key order of the text, so that both faces of
    # an answer read the same.
    return ModelAnswer(json.loads(compact_json(value)), is_error=is_error)


ADAPTER_FAILURE: Final = refusal(CapabilityError("INTERNAL_ERROR", stage="adapter"))
"""What a model is told when translation itself broke: the concealed shape."""
