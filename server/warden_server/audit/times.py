"""Times in audit filters: absolute ISO 8601 or a duration back from now.

Stored timestamps are UTC ISO 8601 with milliseconds and a ``Z``
(``2026-01-02T03:04:05.678Z``), so they compare as text; every filter time is
brought to exactly that form.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from warden_server.errors import InvalidRequest
from warden_server.policy.model import parse_duration
from warden_server.records.events import iso


def parse_time(text: str, now: datetime, field: str = "time") -> str:
    """``text`` as a stored timestamp.

    Args:
        text: ``2026-01-02``, ``2026-01-02T03:04:05Z`` (an offset or none,
            meaning UTC), or a duration such as ``90s``, ``15m``, ``1h``, ``7d``
            meaning that long before ``now``.
        now: The reference for durations.
        field: The filter's name, for the error message.

    Raises:
        InvalidRequest: neither form.
    """
    value = text.strip()
    try:
        moment = now - timedelta(seconds=parse_duration(value))
    except OverflowError:
        raise InvalidRequest(f"{field} {text!r} reaches back before the year 1") from None
    except ValueError:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidRequest(
                f"{field} {text!r} is neither an ISO 8601 time (2026-01-02T03:04:05Z) "
                "nor a duration back from now (90s, 15m, 1h, 7d)"
            ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return iso(moment)
