"""Reading the registry, as a starting plane does to check its rules against
every registered version, builds no validator: a version's input validator is
built when a call to it is first validated."""

from __future__ import annotations

from pathlib import Path

import pytest
from jsonschema.protocols import Validator

from warden.shared.schema import Schema, compile_validator, validation_issues
from warden_server import registry
from warden_server.auth.services import Service
from warden_server.registry import CapabilityDefinition, Registry
from warden_server.store import SQLiteStore

ORDERS = Service("orders", ("orders",))
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


def registered_store(path: Path, count: int) -> SQLiteStore:
    store = SQLiteStore(path)
    definitions = [
        CapabilityDefinition(
            id=f"orders.op{k}", input_schema=SCHEMA, output_schema={}, side_effect="read"
        )
        for k in range(count)
    ]
    Registry(store).register(ORDERS, definitions)
    return store


def test_reading_every_version_builds_no_validator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = registered_store(tmp_path / "warden.db", 3)
    built: list[object] = []

    def counted(schema: Schema) -> Validator:
        built.append(schema)
        return compile_validator(schema)

    monkeypatch.setattr(registry, "compile_validator", counted)
    try:
        versions = Registry(store).every_version()
        assert [c.id for c in versions] == ["orders.op0", "orders.op1", "orders.op2"]
        assert built == []
        assert versions[1].input_validator is versions[1].input_validator
        assert built == [SCHEMA]  # built on first use, once
    finally:
        store.close()


def test_a_version_read_from_the_store_validates_input_on_first_use(tmp_path: Path) -> None:
    store = registered_store(tmp_path / "warden.db", 1)
    try:
        capability = Registry(store).get("orders.op0")
        assert capability is not None
        validator = capability.input_validator
        assert validator is capability.input_validator  # built once
        assert validation_issues(validator, {"n": 1}) == []
        issues = validation_issues(validator, {"n": "one", "extra": True})
        assert [(i.path, i.message) for i in issues] == [
            ("/extra", "is not an allowed property"),
            ("/n", "must be of type integer"),
        ]
    finally:
        store.close()
