"""Lines that are no JSON-RPC message, written to an MCP server over stdio,
and what it answers: the Python and the TypeScript adapters are held to the
same answers."""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

INITIALIZE: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}

EXPECTED = [
    {"code": -32700, "message": "Parse error"},
    {"code": -32700, "message": "Parse error"},
    {"code": -32600, "message": "Invalid Request"},
]
"""The errors (id null) for the three unreadable lines ``answers`` writes."""


def answers(command: list[str], env: dict[str, str], tool: str, good: str) -> list[Any]:
    """Start the server, initialize, write text that is not JSON, a call
    (id 1) whose arguments are an object holding a lone surrogate escape,
    JSON that is no message, then a good call (id 2) of ``tool`` with
    ``good`` (JSON text); every answer up to the good call's."""
    odd = '{"note":"\\ud800"}'
    call = '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"%s","arguments":%s}}'
    lines = [
        json.dumps(INITIALIZE),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        "this is not JSON",
        call % (1, tool, odd),
        json.dumps({"hello": "world"}),
        call % (2, tool, good),
    ]
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    killer = threading.Timer(30, process.kill)
    killer.start()
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write("\n".join(lines) + "\n")
        process.stdin.flush()
        found: list[Any] = []
        while not any(a.get("id") == 2 for a in found):
            text = process.stdout.readline()
            assert text, f"the server ended without answering the call: {found}"
            found.append(json.loads(text))
        return found
    finally:
        killer.cancel()
        process.kill()
        process.wait()


def unreadable(found: list[Any]) -> list[Any]:
    """The errors answered with id null, in order."""
    return [a["error"] for a in found if "id" in a and a["id"] is None]
