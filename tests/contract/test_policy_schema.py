"""The JSON Schemas in schemas/ are generated from the policy models, stay in
step with them, and validate the example policies editors open."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from warden_server.policy.model import json_schema

ROOT = Path(__file__).resolve().parent.parent.parent
SCHEMAS = {
    "policy": ROOT / "schemas/policy.schema.json",
    "tests": ROOT / "schemas/policy-tests.schema.json",
}
HEADER = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")


@pytest.mark.parametrize("kind", ["policy", "tests"])
def test_committed_schema_matches_the_models(kind: str) -> None:
    committed = json.loads(SCHEMAS[kind].read_text())
    assert committed == json_schema(tests=kind == "tests"), (
        f"{SCHEMAS[kind].relative_to(ROOT)} is stale: run make schemas"
    )


def example_files() -> list[tuple[Path, str]]:
    files = [(p, "policy") for p in sorted((ROOT / "policies").glob("*.yaml"))]
    return files + [(p, "tests") for p in sorted((ROOT / "policies/tests").glob("*.yaml"))]


@pytest.mark.parametrize(("path", "kind"), example_files(), ids=lambda v: getattr(v, "name", v))
def test_examples_name_their_schema_and_validate_against_it(path: Path, kind: str) -> None:
    first = path.read_text().splitlines()[0]
    match = HEADER.match(first)
    assert match, f"{path.name} should start with a yaml-language-server $schema header"
    assert (path.parent / match.group(1)).resolve() == SCHEMAS[kind]
    validator = Draft202012Validator(json.loads(SCHEMAS[kind].read_text()))
    errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
    assert errors == []


@pytest.mark.parametrize(
    "rule",
    [
        {"id": "x", "capabilities": ["a.b"], "effect": "deny", "approvers": "true"},
        {"id": "x", "capabilities": ["a.b"], "effect": "deny", "ttl": "1h"},
        {"id": "x", "capabilities": ["a.b"], "effect": "permit"},
        {"id": "x", "capabilities": ["a.b"], "effect": "allow", "efect": "allow"},
        {"id": "X", "capabilities": ["a.b"], "effect": "allow"},
        {"id": "x", "capabilities": [], "effect": "allow"},
        {"capabilities": ["a.b"], "effect": "allow"},
    ],
)
def test_the_policy_schema_rejects_what_the_checker_rejects(rule: dict[str, object]) -> None:
    validator = Draft202012Validator(json_schema())
    assert list(validator.iter_errors({"rules": [rule]})), rule


def test_the_policy_schema_accepts_a_full_rule() -> None:
    rule = {
        "id": "refunds",
        "capabilities": ["orders.*"],
        "effect": "require_approval",
        "when": True,
        "message": "m",
        "message_expr": '"m"',
        "approvers": "true",
        "ttl": "1h",
        "mode": "audit",
        "description": "d",
    }
    assert list(Draft202012Validator(json_schema()).iter_errors({"rules": [rule]})) == []
