"""The SDK installs alone: a fresh virtual environment with only the `warden`
distribution (client/) holds none of the plane's dependencies, and a service
there registers and invokes a capability with a running plane."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ORDERS_TOKEN, ROOT, Plant

PLANE_ONLY = {
    "warden-server",
    "cel-python",
    "cel-expr-python",
    "sqlite-utils",
    "click",
    "watchfiles",
    "opentelemetry-sdk",
    "prometheus-client",
    "grpcio-health-checking",
    "grpcio-reflection",
    "pyyaml",
}
"""Distributions the plane needs and a service does not."""

SERVICE = """
import importlib.metadata
import importlib.util
import json
import sys

from pydantic import BaseModel

import warden
from warden.adapters import openai as warden_tools

target, token, actor = sys.argv[1:]


class EchoIn(BaseModel):
    n: int


class EchoOut(BaseModel):
    n: int


rt = warden.Runtime(target, service="orders", token=token)


@rt.capability("orders.echo", input=EchoIn, output=EchoOut, side_effect="read")
def echo(inp: EchoIn, ctx: warden.Context) -> EchoOut:
    return EchoOut(n=inp.n)


rt.register()
envelope = rt.invoke("orders.echo", {"n": 7}, actor=actor)
tools = warden_tools.tools(rt, actor=actor)
content = warden_tools.call(rt, "orders-echo", '{"n": 8}', actor=actor)
rt.close()
try:
    import warden.adapters.mcp
    mcp_adapter = "imported"
except ImportError as exc:
    mcp_adapter = str(exc)
print(json.dumps({
    "warden": warden.__file__,
    "distributions": sorted(
        d.metadata["Name"].lower().replace("_", "-") for d in importlib.metadata.distributions()
    ),
    "warden_server": importlib.util.find_spec("warden_server") is not None,
    "status": envelope.status,
    "output": envelope.model_output,
    "invocation_id": envelope.invocation_id,
    "tools": [tool["function"]["name"] for tool in tools],
    "content": content,
    "mcp_adapter": mcp_adapter,
}))
"""


def run(command: list[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run without this checkout's sources on the path, as a newcomer's shell would."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    return subprocess.run(
        [str(part) for part in command],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        **kwargs,
    )


@pytest.fixture(scope="module")
def sdk_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a fresh virtual environment into which only client/ was installed."""
    root = tmp_path_factory.mktemp("sdk-only")
    # Built from a copy, so that the build leaves nothing in the checkout.
    source = root / "source"
    shutil.copytree(
        ROOT / "client",
        source,
        ignore=shutil.ignore_patterns("typescript", "__pycache__", "*.egg-info", "build", "dist"),
    )
    venv = root / "venv"
    created = run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert created.returncode == 0, created.stderr
    python = venv / "bin" / "python"
    installed = run([sys.executable, "-m", "pip", "--python", python, "install", source])
    assert installed.returncode == 0, installed.stderr
    return python


@pytest.mark.heavy
def test_sdk_alone_installs_without_the_planes_dependencies_and_invokes(
    sdk_python: Path, lab_plant: Plant, tmp_path: Path
) -> None:
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    result = run(
        [sdk_python, script, lab_plant.target, ORDERS_TOKEN, lab_plant.token()], cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    distributions = set(shown["distributions"])
    print("installed with the SDK alone:", ", ".join(sorted(distributions)))

    assert Path(shown["warden"]).is_relative_to(sdk_python.parent.parent), shown["warden"]
    assert "warden" in distributions
    assert distributions & PLANE_ONLY == set()
    assert not shown["warden_server"]
    assert "mcp" not in distributions
    assert shown["mcp_adapter"] == (
        "warden.adapters.mcp needs the mcp package: install the SDK with its extra, "
        "warden[mcp] (from a checkout: pip install './client[mcp]')"
    )

    assert (shown["status"], shown["output"]) == ("succeeded", {"n": 7})
    assert shown["tools"] == ["orders-echo"]
    assert shown["content"] == '{"n":8}'
    (outcome,) = lab_plant.events(invocation_id=shown["invocation_id"], kind="outcome")
    assert (outcome["status"], outcome["service"]) == ("succeeded", "orders")
