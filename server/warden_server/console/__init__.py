"""The web console: approvers decide, security teams read the audit log, in
a browser, through the plane's gRPC APIs with each person's own token."""

from warden_server.console.app import Console, build_app
from warden_server.console.serving import (
    ConsoleConfigError,
    RunningConsole,
    bind,
    console_of,
    run,
    start,
)

__all__ = [
    "Console",
    "ConsoleConfigError",
    "RunningConsole",
    "bind",
    "build_app",
    "console_of",
    "run",
    "start",
]
