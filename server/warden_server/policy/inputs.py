"""Which ``input`` fields a capability's JSON Schema declares, so the checker
can flag ``input.amout`` before it fails every call at run time.

A field exists when some alternative of the schema (``$ref``, ``allOf``,
``anyOf``, ``oneOf``) lists it in ``properties``, matches it with
``patternProperties``, or gives ``additionalProperties`` a schema. An object
that declares no properties at all (a free-form map) accepts any field.
Declared ``properties`` without ``additionalProperties`` count as closed:
policies should read the fields a capability declares.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Schema = Mapping[str, Any] | bool


@dataclass(frozen=True, slots=True)
class InputSchema:
    """A capability's id and input schema, as the checker needs them."""

    capability_id: str
    schema: Mapping[str, Any]
    version: str = ""
    shape: str = field(init=False, repr=False, compare=False)
    """The schema's content (its JSON, keys sorted): what the checks of a
    large set, whose capabilities often share a schema, do once per shape."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", json.dumps(self.schema, sort_keys=True, default=repr))


def missing_field(schemas: Sequence[InputSchema], path: tuple[str, ...]) -> str | None:
    """None when some schema declares ``input.<path>``; else why not, naming the
    first field that none of them has and the fields there are."""
    best: tuple[int, list[str]] | None = None
    for entry in schemas:
        found, depth, known = _walk(entry.schema, path)
        if found:
            return None
        if best is None or depth > best[0]:
            best = (depth, known)
    assert best is not None, "missing_field needs at least one schema"
    depth, known = best
    ids = ", ".join(
        sorted(
            {f"{s.capability_id} v{s.version}" if s.version else s.capability_id for s in schemas}
        )
    )
    where = "input" + "".join(f".{p}" for p in path[:depth])
    fields = f" (fields: {', '.join(sorted(known))})" if known else ""
    full = "input." + ".".join(path)
    return f"{full}: {where} has no field {path[depth]!r} in the input schema of {ids}{fields}"


def _walk(root: Mapping[str, Any], path: tuple[str, ...]) -> tuple[bool, int, list[str]]:
    """(declared?, how far it got, the fields known where it stopped)."""
    current: list[Schema] = [root]
    for depth, name in enumerate(path):
        following: list[Schema] = []
        known: set[str] = set()
        for alternative in _alternatives(current, root):
            if alternative is False:
                continue
            if alternative is True or _is_open(alternative):
                return True, len(path), []
            properties = alternative.get("properties") or {}
            known.update(properties)
            if name in properties:
                following.append(properties[name])
                continue
            patterns = alternative.get("patternProperties") or {}
            matched = [s for p, s in patterns.items() if re.search(p, name)]
            following.extend(matched)
            extra = alternative.get("additionalProperties")
            if not matched and isinstance(extra, Mapping | bool) and extra is not False:
                following.append(extra)
        if not following:
            return False, depth, sorted(known)
        current = following
    return True, len(path), []


def _is_open(schema: Mapping[str, Any]) -> bool:
    """An object (or anything) whose fields are not declared: a free-form map."""
    kinds = schema.get("type")
    maybe_object = (
        kinds is None or kinds == "object" or (isinstance(kinds, list) and "object" in kinds)
    )
    declares = any(
        key in schema
        for key in (
            "properties",
            "patternProperties",
            "additionalProperties",
            "$ref",
            "allOf",
            "anyOf",
            "oneOf",
        )
    )
    return maybe_object and not declares


def _alternatives(schemas: list[Schema], root: Mapping[str, Any]) -> Iterator[Schema]:
    """Every schema a value may have to satisfy: refs followed, combinators opened."""
    stack = list(reversed(schemas))
    seen: set[int] = set()
    while stack:
        schema = stack.pop()
        if isinstance(schema, bool):
            yield schema
            continue
        if id(schema) in seen:
            continue
        seen.add(id(schema))
        ref = schema.get("$ref")
        if isinstance(ref, str):
            target = _resolve(root, ref)
            if target is not None:
                stack.append(target)
        for key in ("allOf", "anyOf", "oneOf"):
            stack.extend(s for s in schema.get(key, ()) if isinstance(s, Mapping | bool))
        own = {k: v for k, v in schema.items() if k not in ("$ref", "allOf", "anyOf", "oneOf")}
        if own.keys() & {"properties", "patternProperties", "additionalProperties"} or not (
            schema.keys() & {"$ref", "allOf", "anyOf", "oneOf"}
        ):
            yield own


def _resolve(root: Mapping[str, Any], ref: str) -> Schema | None:
    """A local JSON pointer (``#/$defs/Item``); remote refs are not followed."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for escaped in ref[1:].split("/")[1:]:
        part = escaped.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, Mapping | bool) else None


def schemas_from_snapshot(data: Any) -> list[InputSchema]:
    """The input schemas in a capabilities snapshot (``warden policy capabilities``):
    ``{"capabilities": [{"id": ..., "input_schema": {...}, ...}, ...]}`` or the bare list.

    Raises:
        ValueError: the snapshot has another shape (the message says where).
    """
    items = data.get("capabilities") if isinstance(data, Mapping) else data
    if not isinstance(items, list):
        raise ValueError('a capabilities snapshot is {"capabilities": [...]} or a list')
    schemas = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ValueError(f"capabilities[{index}]: must be an object")
        capability_id, schema = item.get("id"), item.get("input_schema")
        version = item.get("version", "")
        if not isinstance(capability_id, str) or not isinstance(schema, Mapping):
            raise ValueError(
                f"capabilities[{index}]: needs an 'id' string and an 'input_schema' object"
            )
        schemas.append(InputSchema(capability_id, schema, str(version)))
    return schemas
