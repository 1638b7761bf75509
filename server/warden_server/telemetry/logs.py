"""Structured logs: one JSON object per line, or text with key=value fields.

Code logs with ``extra={"fields": {...}}``; the fields are ids, stages, codes
and timings, never inputs, outputs, causes or messages (SI-5).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Final, Literal

FIELDS: Final = "fields"
"""The ``extra`` key whose dict becomes the structured fields of a record."""

LEAKY_LOGGERS: Final = ("celpy",)
"""Libraries whose debug logs print the values they work on: cel-python logs
every policy activation, inputs included."""


def silence_leaky_loggers() -> None:
    """Cap the leaky libraries at WARNING, whatever the root level (SI-5)."""
    for name in LEAKY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def fields(**values: Any) -> dict[str, dict[str, Any]]:
    """``extra=`` for a structured log record, dropping None values."""
    return {FIELDS: {k: v for k, v in values.items() if v is not None}}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message and the fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, FIELDS, None) or {})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The classic line, with the structured fields appended as key=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = getattr(record, FIELDS, None)
        if extra:
            line += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        return line


def configure_logging(level: str, fmt: Literal["text", "json"]) -> None:
    """Send the process's logs to stderr in the chosen format."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
