"""The signature of a notification: ``X-Warden-Signature: t=<unix seconds>,
v1=<hex HMAC-SHA256 of "<t>.<body>" under the webhook's secret>``.

The timestamp is signed with the body, so a receiver can refuse a replayed
delivery by its age (and a retried one carries a fresh timestamp).
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Warden-Signature"
TOLERANCE_S = 300


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The header value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(
    secret: str, body: bytes, header: str, now: float, tolerance_s: int = TOLERANCE_S
) -> bool:
    """Whether ``header`` signs ``body`` under ``secret`` and is recent: what a
    receiver checks (shown here so that the two sides cannot drift apart)."""
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(parts.get("t", ""))
    except ValueError:
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = sign(secret, body, timestamp).partition(",v1=")[2]
    return hmac.compare_digest(expected, parts.get("v1", ""))
