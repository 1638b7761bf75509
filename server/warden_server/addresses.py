"""The addresses a plane serves on, checked before anything else starts.

``warden serve`` checks them first, before it starts the process the others
fork from or imports the plane: a port another program holds fails the start
at once, with nothing written and nothing left running. This module imports
nothing of the plane's.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warden_server.config import Config


class MetricsUnavailable(OSError):
    """``/metrics`` cannot be served where ``[telemetry] metrics_listen`` says."""

    def __init__(self, listen: str, cause: OSError | ValueError) -> None:
        in_use = isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE
        why = "the port is in use" if in_use else (_reason(cause) or "not an address")
        super().__init__(f"cannot serve metrics on {listen}: {why}")
        self.listen = listen


def _reason(exc: BaseException) -> str:
    return exc.strerror.lower() if isinstance(exc, OSError) and exc.strerror else str(exc)


def check_addresses(config: Config) -> None:
    """Fail when the plane's port or its ``/metrics`` address is taken or not
    one: before a key file is written or a process started.

    Raises:
        OSError: the plane's address (MetricsUnavailable: the metrics address).
    """
    claim(config.server.listen)
    check_metrics_address(config.telemetry.metrics_listen)


def claim(listen: str) -> None:
    """Fail when anything listens on ``listen`` already.

    The processes of one plane bind with SO_REUSEPORT, which would also let a
    second plane share the port unnoticed; binding once without it first
    makes a second plane fail to start instead.

    Raises:
        OSError: the address is in use or not available.
    """
    if listen.rpartition(":")[2] == "0":
        return  # the kernel picks a port nobody holds
    for family, kind, proto, address in addresses(listen):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError:
                raise OSError(
                    f"cannot listen on {listen}: the address is in use or not available"
                ) from None


def check_metrics_address(listen: str | None) -> None:
    """Fail when ``/metrics`` could not be served on ``listen``, as ``claim``
    does for the plane's port; the endpoint itself binds it once the plane
    serves.

    Raises:
        MetricsUnavailable: the address is in use, not available or not one.
    """
    if not listen or listen.rpartition(":")[2] == "0":
        return
    try:
        family, kind, proto, address = metrics_address(listen)
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except (OSError, ValueError) as exc:
        raise MetricsUnavailable(listen, exc) from None


def metrics_address(listen: str) -> tuple[socket.AddressFamily, socket.SocketKind, int, Any]:
    """Where ``/metrics`` binds for ``listen``: the first address of its host
    (an IPv6 host in brackets; 127.0.0.1 when none is given).

    Raises:
        OSError: the host does not resolve.
        ValueError: the port is not a number from 0 to 65535.
    """
    host = listen.rpartition(":")[0].strip("[]") or "127.0.0.1"
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port(listen), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return family, kind, proto, address


def addresses(listen: str) -> list[tuple[socket.AddressFamily, socket.SocketKind, int, Any]]:
    """What binding ``listen`` binds: each address its host resolves to.

    Raises:
        OSError: the host does not resolve, or the port is not a number.
    """
    host = listen.rpartition(":")[0].strip("[]") or "0.0.0.0"  # noqa: S104 (every address)
    try:
        found = socket.getaddrinfo(
            host, port(listen), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, ValueError) as exc:
        raise OSError(f"cannot listen on {listen}: {exc}") from None
    return [(family, kind, proto, address) for family, kind, proto, _, address in found]


def port(listen: str) -> int:
    """The port of ``host:port``. The resolver would take any number, 99999
    as 34463.

    Raises:
        ValueError: it is not a number from 0 to 65535.
    """
    number = listen.rpartition(":")[2]
    if not (number.isdigit() and int(number) <= 65_535):
        raise ValueError("not HOST:PORT with a port from 0 to 65535")
    return int(number)
