"""Serving the console with uvicorn: in the foreground for ``warden console``,
or on a thread (``start``) for a caller that runs it beside other work."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import threading
from dataclasses import dataclass

import uvicorn

from warden.shared.tls import TLS
from warden_server.config import Config
from warden_server.console.app import Console, build_app
from warden_server.console.plane import Plane
from warden_server.console.sessions import Sessions
from warden_server.policy.model import parse_duration

GRACE_S = 2
"""How long open pages (a live approvals stream) may take to close at shutdown."""


class ConsoleConfigError(Exception):
    """The console cannot start; the message says why."""


@dataclass
class RunningConsole:
    """A console serving on a thread."""

    url: str
    console: Console
    _server: uvicorn.Server
    _thread: threading.Thread

    def stop(self) -> None:
        self.console.stopping.set()
        self._server.should_exit = True
        self._thread.join(timeout=GRACE_S + 5)
        self.console.plane.close()


def console_of(config: Config, *, target: str | None = None, tls: TLS | None = None) -> Console:
    """The console's shared state for ``config`` (``target`` overrides its plane)."""
    section = config.console
    plane_target = target or section.target or config.server.listen
    return Console(
        plane=Plane(plane_target, tls),
        sessions=Sessions(parse_duration(section.session_ttl)),
        token_header=section.token_header,
        secure_cookies=bool(section.tls_cert_file),
    )


def bind(listen: str) -> socket.socket:
    """A listening socket on ``host:port`` (port 0 picks one).

    Raises:
        ConsoleConfigError: ``listen`` is not HOST:PORT, or cannot be bound.
    """
    host, colon, port = listen.rpartition(":")
    if not (colon and port.isdigit() and int(port) < 65_536):
        raise ConsoleConfigError(
            f"cannot listen on {listen}: not HOST:PORT with a port from 0 to 65535"
        )
    host = host.strip("[]") or "127.0.0.1"
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
    except (OSError, ValueError) as exc:
        why = (
            "the address is in use or not available"
            if isinstance(exc, OSError) and exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL)
            else getattr(exc, "strerror", None) or str(exc)
        )
        raise ConsoleConfigError(f"cannot listen on {listen}: {why}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _server(config: Config, console: Console) -> uvicorn.Server:
    section = config.console
    cert = config.path(section.tls_cert_file) if section.tls_cert_file else None
    key = config.path(section.tls_key_file) if section.tls_key_file else None
    for path in (cert, key):
        if path is not None and not os.path.exists(path):
            raise ConsoleConfigError(f"{path}: no such file ([console] tls_cert_file/tls_key_file)")
    settings = uvicorn.Config(
        build_app(console),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACE_S,
        ssl_certfile=str(cert) if cert else None,
        ssl_keyfile=str(key) if key else None,
        lifespan="off",
        server_header=False,
    )
    return uvicorn.Server(settings)


def run(config: Config, console: Console, sock: socket.socket) -> None:
    """Serve on ``sock`` (from ``bind``) in the foreground until interrupted."""
    server = _server(config, console)
    try:
        server.run(sockets=[sock])
    finally:
        console.stopping.set()
        console.plane.close()


def start(config: Config, console: Console, listen: str = "127.0.0.1:0") -> RunningConsole:
    """Serve on a thread; returns once the console answers."""
    sock = bind(listen)
    server = _server(config, console)
    host, port = sock.getsockname()[:2]
    scheme = "https" if config.console.tls_cert_file else "http"

    def serve() -> None:
        asyncio.run(server.serve(sockets=[sock]))

    thread = threading.Thread(target=serve, name="warden-console", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        threading.Event().wait(0.01)
    return RunningConsole(f"{scheme}://{host}:{port}", console, server, thread)
