"""The orders service as an MCP server over stdio.

An MCP host (a desktop assistant, an agent framework) starts this process and
speaks MCP on its stdin and stdout. The actor the model acts for is the
process's: the host sets ``WARDEN_ACTOR_TOKEN`` (a JWT) in its environment.

    WARDEN_ACTOR_TOKEN=$(warden token mint --config warden.toml --sub bot-7 --role support \\
        --tenant acme) python examples/orders/mcp_server.py
"""

from __future__ import annotations

import os

from service import build_runtime

from warden.adapters.mcp import serve_stdio


def main() -> None:
    target = os.environ.get("WARDEN_TARGET", "127.0.0.1:50051")
    token = os.environ.get("WARDEN_SERVICE_ORDERS_TOKEN", "dev-only-orders-token")
    with build_runtime(target, token) as rt:
        serve_stdio(rt, actor=os.environ["WARDEN_ACTOR_TOKEN"])


if __name__ == "__main__":
    main()
