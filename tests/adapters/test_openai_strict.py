"""Strict function-calling tools: definitions OpenAI's strict mode accepts,
checked with the openai package's own types, and calls whose nulls for
optional properties reach the plane as absent fields."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai.lib._parsing._completions import validate_input_tools
from openai.types.chat import ChatCompletionFunctionToolParam
from pydantic import BaseModel, Field, TypeAdapter

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from warden.adapters import openai as warden_openai

OPENAI_TOOL = TypeAdapter(ChatCompletionFunctionToolParam)

REFUND = {
    "title": "RefundIn",
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "title": "Order Id"},
        "amount": {"type": "integer", "minimum": 1},
        "note": {"type": "string", "default": ""},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city"],
        },
        "reason": {"enum": ["damaged", "late"]},
    },
    "required": ["order_id", "amount"],
}


class Address(BaseModel):
    city: str
    zip: str | None = None


class Line(BaseModel):
    sku: str
    gift_wrap: bool = False


class ShipIn(BaseModel):
    order_id: str = Field(min_length=1)
    address: Address | None = None
    lines: list[Line] = []
    note: str = ""


class ShipOut(BaseModel):
    received: dict[str, Any]


def assert_openai_accepts(tool: dict[str, Any]) -> None:
    """The openai package's own type takes the definition whole, and its
    client would send it as a strict tool."""
    assert OPENAI_TOOL.validate_python(tool, strict=True) == tool, "every key is one the type knows"
    assert validate_input_tools([tool]) == [tool]  # type: ignore[list-item]


def assert_strict_mode(node: Any) -> None:
    """OpenAI's strict-mode rules, on every schema in the tree."""
    if isinstance(node, list):
        for item in node:
            assert_strict_mode(item)
    if not isinstance(node, dict):
        return
    assert not {"default", "title", "$schema"} & node.keys(), node
    if node.get("type") == "object" or "properties" in node:
        assert node["additionalProperties"] is False, node
        assert node["required"] == list(node["properties"]), node
    for key, value in node.items():
        if key in {"properties", "$defs"}:
            for schema in value.values():
                assert_strict_mode(schema)
        elif key not in {"enum", "const", "required"}:
            assert_strict_mode(value)


def test_a_strict_schema_closes_every_object_and_requires_every_property() -> None:
    assert warden_openai.strict_schema(REFUND) == {
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "amount": {"type": "integer", "minimum": 1},
            "note": {"type": ["string", "null"]},
            "address": {
                "type": ["object", "null"],
                "properties": {"city": {"type": "string"}, "zip": {"type": ["string", "null"]}},
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
            "reason": {"anyOf": [{"enum": ["damaged", "late"]}, {"type": "null"}]},
        },
        "required": ["order_id", "amount", "note", "address", "reason"],
        "additionalProperties": False,
    }
    assert REFUND["required"] == ["order_id", "amount"], "the registered schema is not changed"


def test_an_object_without_properties_is_closed_all_the_same() -> None:
    assert warden_openai.strict_schema({"type": "object"}) == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }


def test_a_pydantic_schema_with_definitions_is_strict_throughout() -> None:
    strict = warden_openai.strict_schema(ShipIn.model_json_schema())
    assert_strict_mode(strict)
    assert set(strict["$defs"]) == {"Address", "Line"}
    # Already nullable: not wrapped again.
    assert strict["properties"]["address"] == {
        "anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]
    }
    assert strict["$defs"]["Address"]["properties"]["zip"] == {
        "anyOf": [{"type": "string"}, {"type": "null"}]
    }


def test_strict_arguments_take_nulls_for_optional_properties_as_absent() -> None:
    schema = ShipIn.model_json_schema()
    written = json.dumps(
        {
            "order_id": "A1",
            "address": {"city": "Oslo", "zip": None},
            "lines": [{"sku": "S-1", "gift_wrap": None}],
            "note": None,
        }
    )
    assert json.loads(warden_openai.strict_arguments(written, schema)) == {
        "order_id": "A1",
        "address": {"city": "Oslo"},
        "lines": [{"sku": "S-1"}],
    }
    # A null the schema requires stays for the plane to judge; so does text that is not JSON.
    assert json.loads(warden_openai.strict_arguments('{"order_id": null}', schema)) == {
        "order_id": None
    }
    assert warden_openai.strict_arguments("{not json", schema) == "{not json"


@pytest.fixture
def shipping(lab_plant: Plant) -> Iterator[tuple[warden.Runtime, list[ShipIn]]]:
    rt = warden.Runtime(lab_plant.target, service="orders", token=ORDERS_TOKEN)
    seen: list[ShipIn] = []

    @rt.capability("orders.ship", input=ShipIn, output=ShipOut, side_effect="read")
    def ship(inp: ShipIn, ctx: warden.Context) -> ShipOut:
        """Ship an order."""
        seen.append(inp)
        return ShipOut(received=inp.model_dump(exclude_unset=True))

    rt.register()
    yield rt, seen
    rt.close()


def test_strict_tools_are_openai_strict_tools(
    shipping: tuple[warden.Runtime, list[ShipIn]], lab_plant: Plant
) -> None:
    rt, _ = shipping
    (tool,) = warden_openai.tools(rt, actor=lab_plant.token(), strict=True)
    (plain,) = warden_openai.tools(rt, actor=lab_plant.token())
    assert "strict" not in plain["function"]
    assert plain["function"]["parameters"] == ShipIn.model_json_schema()
    assert tool["function"]["strict"] is True
    assert tool["function"]["parameters"] == warden_openai.strict_schema(
        plain["function"]["parameters"]
    )
    assert_strict_mode(tool["function"]["parameters"])
    assert_openai_accepts(tool)


def test_a_strict_call_reaches_the_handler_without_the_models_nulls(
    shipping: tuple[warden.Runtime, list[ShipIn]], lab_plant: Plant
) -> None:
    rt, seen = shipping
    written = (
        '{"order_id": "A1", "address": {"city": "Oslo", "zip": null}, "lines": [], "note": null}'
    )
    content = warden_openai.call(rt, "orders-ship", written, actor=lab_plant.token(), strict=True)
    received = {"order_id": "A1", "address": {"city": "Oslo"}, "lines": []}
    assert json.loads(content) == {"received": received}
    assert seen[-1] == ShipIn(order_id="A1", address=Address(city="Oslo"), lines=[])


def test_a_strict_acall_drops_the_nulls_too(
    shipping: tuple[warden.Runtime, list[ShipIn]], lab_plant: Plant
) -> None:
    rt, _ = shipping
    actor = lab_plant.token()

    async def model_turn() -> tuple[list[dict[str, Any]], str]:
        tools = await warden_openai.atools(rt, actor=actor, strict=True)
        written = '{"order_id": "B2", "note": null}'
        return tools, await warden_openai.acall(
            rt, "orders-ship", written, actor=actor, strict=True
        )

    tools, content = asyncio.run(model_turn())
    assert tools[0]["function"]["strict"] is True
    assert json.loads(content) == {"received": {"order_id": "B2"}}


def test_without_strict_the_models_nulls_reach_the_plane_as_written(
    shipping: tuple[warden.Runtime, list[ShipIn]], lab_plant: Plant
) -> None:
    rt, seen = shipping
    content = warden_openai.call(
        rt, "orders-ship", '{"order_id": "A1", "note": null}', actor=lab_plant.token()
    )
    assert json.loads(content)["code"] == "INPUT_INVALID"
    assert seen == []


@pytest.mark.parametrize("strict", [True, False])
def test_a_lone_surrogate_escape_is_invalid_input_recorded_by_the_plane(
    shipping: tuple[warden.Runtime, list[ShipIn]], lab_plant: Plant, strict: bool
) -> None:
    """JSON's escape for half a character parses to text UTF-8 cannot carry;
    taking the model's nulls out used to write it back raw and raise."""
    rt, seen = shipping
    written = '{"order_id": "\\ud800", "note": null}'
    content = warden_openai.call(rt, "orders-ship", written, actor=lab_plant.token(), strict=strict)
    assert json.loads(content)["code"] == "INPUT_INVALID"
    assert seen == []
    (row,) = lab_plant.events(kind="decision", code="INPUT_INVALID")
    assert row["capability_id"] == "orders.ship"
