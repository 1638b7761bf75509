"""The orders service as an MCP server over stdio.

An MCP host (a desktop assistant, an agent framework) starts this process and
speaks MCP on its stdin and stdout. The actor the model acts for is the
process's: the host sets ``WARDEN_ACTOR_TOKEN`` (a JWT) in its environment.

    WARDEN_ACTOR_TOKEN=$(warden token mint --config warden.toml --sub bot-7 --role support \\
        --tenant acme) python examples/orders/mcp_server.py
"""

from __future__ import annotations

import os
import sys

from service import build_runtime

from warden.adapters.mcp import serve_stdio

HINT = (
    "This is an MCP server: it speaks JSON-RPC on stdin and stdout, and waits for an "
    "MCP host (an agent or a desktop assistant) to start it and talk. Configure your "
    "host to run this command; press Ctrl-D to stop waiting here."
)


def main() -> None:
    target = os.environ.get("WARDEN_TARGET", "127.0.0.1:50051")
    token = os.environ.get("WARDEN_SERVICE_ORDERS_TOKEN", "dev-only-orders-token")
    actor = os.environ.get("WARDEN_ACTOR_TOKEN")
    if not actor:
        raise SystemExit(
            "set WARDEN_ACTOR_TOKEN to the JWT of the actor the model acts for, e.g. "
            "$(warden token mint --config warden.toml --sub bot-7 --role support --tenant acme)"
        )
    if sys.stdin.isatty():
        # Run by hand in a terminal, the server would seem to hang: say what it waits for.
        print(HINT, file=sys.stderr, flush=True)
    with build_runtime(target, token) as rt:
        serve_stdio(rt, actor=actor)


if __name__ == "__main__":
    main()
