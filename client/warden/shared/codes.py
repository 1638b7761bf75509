"""The error-code and stage table, read from the protobuf contract.

The proto (``proto/warden/v1/errors.proto``) is the single source of truth:
each enum value carries its defaults as custom options, and this module turns
them into plain Python once, at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from warden.v1 import errors_pb2

_CODE_PREFIX: Final = "ERROR_CODE_"


@dataclass(frozen=True, slots=True)
class CodeDefaults:
    """The defaults of one built-in error code."""

    code: str
    stage: str
    exposed: bool
    retryable: bool
    public_message: str
    meaning: str


@dataclass(frozen=True, slots=True)
class StageInfo:
    """One pipeline stage: its contract string and what it means."""

    name: str
    meaning: str


def _read_stages() -> dict[int, StageInfo]:
    stages = {}
    for value in errors_pb2.Stage.DESCRIPTOR.values:
        if value.number == 0:
            continue
        options = value.GetOptions()
        stages[value.number] = StageInfo(
            name=options.Extensions[errors_pb2.stage_name],
            meaning=options.Extensions[errors_pb2.meaning],
        )
    return stages


def _read_codes(stages: dict[int, StageInfo]) -> dict[str, CodeDefaults]:
    codes = {}
    for value in errors_pb2.ErrorCode.DESCRIPTOR.values:
        if value.number == 0:
            continue
        options = value.GetOptions()
        code = value.name.removeprefix(_CODE_PREFIX)
        codes[code] = CodeDefaults(
            code=code,
            stage=stages[options.Extensions[errors_pb2.default_stage]].name,
            exposed=options.Extensions[errors_pb2.exposed],
            retryable=options.Extensions[errors_pb2.retryable],
            public_message=options.Extensions[errors_pb2.public_message],
            meaning=options.Extensions[errors_pb2.meaning],
        )
    return codes


_STAGES = _read_stages()

STAGES: Final = MappingProxyType({info.name: info for info in _STAGES.values()})
"""Every stage by its contract string, in pipeline order."""

CODES: Final = MappingProxyType(_read_codes(_STAGES))
"""Every built-in error code's defaults, by code string."""

CONCEALED_CODE: Final = "INTERNAL_ERROR"
CONCEALED_MESSAGE: Final = CODES[CONCEALED_CODE].public_message


def defaults(code: str) -> CodeDefaults:
    """The defaults of a built-in code.

    Raises:
        KeyError: ``code`` is not a built-in code (declared codes have no
            table entry; their capability declares them).
    """
    return CODES[code]
