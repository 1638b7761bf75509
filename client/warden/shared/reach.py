"""One wording for a call that reached no plane, whichever client made it.

gRPC answers ``UNAVAILABLE`` both when nothing answered at the address and
when a plane answered that it cannot serve now; only the first is "no plane
at TARGET", and its details name the transport's reason in the transport's
words. This turns those words into one sentence a person can act on.
"""

from __future__ import annotations

import grpc

_REASONS = (
    ("connection refused", "nothing listens on that port"),
    (
        "failed parsing http/2",
        "something answers on that port, but not in gRPC (is it the metrics port?)",
    ),
    (
        "handshake failed",
        "the TLS handshake failed (TLS on one side only, or an untrusted "
        "certificate: see WARDEN_TLS_CA_FILE)",
    ),
    ("errors resolving", "the host name does not resolve"),
    ("dns resolution failed", "the host name does not resolve"),
    ("connection reset", "the connection was closed at once (is it a gRPC server?)"),
    (
        "socket closed",
        "the connection was closed while it was set up (TLS on one side only, or a client "
        "certificate the plane wants and did not get: see WARDEN_TLS_CA_FILE and "
        "WARDEN_TLS_CERT_FILE)",
    ),
)
NO_PLANE = "no plane at "
"""How every "no plane at TARGET" message begins."""
_NOT_CONNECTED = ("failed to connect to all addresses", "errors resolving", "dns resolution failed")


def unreachable(target: str, code: grpc.StatusCode | None, details: str) -> str | None:
    """``no plane at TARGET: <why>`` when the call reached no plane, else None
    (a plane answered, and its own status and message stand)."""
    lowered = details.lower()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and lowered == "deadline exceeded":
        return f"{NO_PLANE}{target} answered in time"
    if code != grpc.StatusCode.UNAVAILABLE or not lowered.startswith(_NOT_CONNECTED):
        return None
    for words, reason in _REASONS:
        if words in lowered:
            return f"{NO_PLANE}{target}: {reason}"
    return f"{NO_PLANE}{target}: cannot connect ({details.rpartition(': ')[2]})"
