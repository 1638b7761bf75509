"""Cerbos as a peer: the same decision as Warden's Begin, asked of a Cerbos PDP.

Cerbos is set up to do the work Warden's Begin does, as far as Cerbos does it:
it verifies the actor's JWT (the same HS256 token, passed as aux data),
validates the 10 input fields against the capability's JSON schema (the one
the SDK registers with Warden; ``schema.enforcement: reject``), evaluates the
same five CEL conditions in a 50-rule policy set, and writes a decision log
and an access log to a file. It is one Go process using every core.

Requests are encoded with ``cerbos_subset.proto`` (Cerbos's field numbers),
compiled at bench time into the bench-local folder.
"""

from __future__ import annotations

import base64
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from google.protobuf import struct_pb2
from google.protobuf.message import Message

from benchmarks.peers import install, workload
from benchmarks.peers.targets import Target, TargetError, free_port, running, wait_until_answering

CHECK_PATH = "/cerbos.svc.v1.CerbosService/CheckResources"
PROTO = Path(__file__).with_name("cerbos_subset.proto")
SCHEMA_FILE = "order.json"
KIND = "order"


@contextmanager
def cerbos_pdp(binary: Path, folder: Path, actor_token: str) -> Iterator[Target]:
    """A Cerbos server over a generated policy folder, checked once for ALLOW."""
    root = folder / "cerbos"
    policies = root / "policies"
    _write_policies(policies)
    port = free_port()
    config = root / "config.yaml"
    config.write_text(_config(port, policies, root / "audit.log"))
    pb = _messages()
    template = _request(pb, actor_token).SerializeToString()
    command = [
        str(binary),
        "server",
        f"--config={config}",
        "--log-level=warn",
        f"--debug-listen-addr=127.0.0.1:{free_port()}",
    ]

    def make(process: subprocess.Popen[bytes]) -> Target:
        return Target("cerbos", port, CHECK_PATH, template, process)

    log = root / "server.log"
    with running("cerbos", command, log, make) as target:
        answer = pb.CheckResourcesResponse.FromString(wait_until_answering(target, log))
        result = answer.results[0] if answer.results else None
        effect = result.actions.get(workload.ACTION) if result else None
        if effect != pb.EFFECT_ALLOW or (result and result.validation_errors):
            raise TargetError(f"cerbos did not allow the request: {answer}")
        yield target


def _write_policies(folder: Path) -> None:
    (folder / "_schemas").mkdir(parents=True)
    schema = workload.OrderIn.model_json_schema()
    (folder / "_schemas" / SCHEMA_FILE).write_text(json.dumps(schema, indent=2))
    (folder / f"{KIND}.yaml").write_text(_resource_policy(KIND, with_schema=True))
    for kind in workload.OTHER_KINDS:
        (folder / f"{kind}.yaml").write_text(_resource_policy(kind, with_schema=False))


def _resource_policy(kind: str, *, with_schema: bool) -> str:
    # JSON is YAML, and it quotes CEL strings without surprises.
    policy: dict[str, object] = {
        "version": "default",
        "resource": kind,
        "rules": [
            {
                "name": rule.name,
                "actions": [workload.ACTION],
                "effect": "EFFECT_ALLOW" if rule.effect == "allow" else "EFFECT_DENY",
                "roles": ["*"],
                "condition": {"match": {"expr": rule.cerbos()}},
            }
            for rule in workload.MATCHING_RULES
        ],
    }
    if with_schema:
        policy["schemas"] = {"resourceSchema": {"ref": f"cerbos:///{SCHEMA_FILE}"}}
    document = {"apiVersion": "api.cerbos.dev/v1", "resourcePolicy": policy}
    return json.dumps(document, indent=2) + "\n"


def _config(port: int, policies: Path, audit_log: Path) -> str:
    key = base64.urlsafe_b64encode(workload.HS256_SECRET.encode()).rstrip(b"=").decode()
    jwks = json.dumps({"keys": [{"kty": "oct", "k": key, "alg": "HS256", "kid": "bench"}]})
    config = {
        "server": {
            "grpcListenAddr": f"127.0.0.1:{port}",
            "httpListenAddr": f"127.0.0.1:{free_port()}",
        },
        "storage": {"driver": "disk", "disk": {"directory": str(policies)}},
        "schema": {"enforcement": "reject"},
        "auxData": {
            "jwt": {
                "keySets": [
                    {
                        "id": "warden",
                        "local": {"data": base64.b64encode(jwks.encode()).decode()},
                        # Warden's development tokens carry no key id.
                        "insecure": {"optionalKid": True},
                    }
                ]
            }
        },
        "audit": {
            "enabled": True,
            "accessLogsEnabled": True,
            "decisionLogsEnabled": True,
            "backend": "file",
            "file": {"path": str(audit_log)},
        },
        "telemetry": {"disabled": True},
    }
    return json.dumps(config, indent=2) + "\n"


def _messages() -> ModuleType:
    """The compiled subset proto, built once into the bench-local folder."""
    out = install.FOLDER / "proto"
    module = out / "cerbos_subset_pb2.py"
    if not module.exists() or module.stat().st_mtime < PROTO.stat().st_mtime:
        out.mkdir(parents=True, exist_ok=True)
        import grpc_tools  # type: ignore[import-untyped]  # no stubs

        includes = Path(grpc_tools.__file__).parent / "_proto"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{PROTO.parent}",
                f"-I{includes}",
                f"--python_out={out}",
                str(PROTO),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise TargetError(f"compiling {PROTO.name} failed: {done.stderr.strip()}")
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module("cerbos_subset_pb2")


def _request(pb: ModuleType, actor_token: str) -> Message:
    # A message class compiled at run time: its fields are unknown to the checker.
    request: Any = pb.CheckResourcesRequest(request_id=workload.ID_PLACEHOLDER)
    principal = request.principal
    principal.id = workload.ACTOR_ID
    principal.policy_version = "default"
    principal.roles.extend(workload.ACTOR_ROLES)
    principal.attr["tenant"].CopyFrom(struct_pb2.Value(string_value=workload.ACTOR_TENANT))
    entry = request.resources.add()
    entry.actions.append(workload.ACTION)
    entry.resource.kind = KIND
    entry.resource.policy_version = "default"
    entry.resource.id = workload.INPUT["order_id"]
    for name, value in workload.INPUT.items():
        entry.resource.attr[name].CopyFrom(_value(value))
    request.aux_data.jwt.token = actor_token
    built: Message = request
    return built


def _value(value: object) -> struct_pb2.Value:
    if isinstance(value, bool):
        return struct_pb2.Value(bool_value=value)
    if isinstance(value, int | float):
        return struct_pb2.Value(number_value=float(value))
    return struct_pb2.Value(string_value=str(value))
