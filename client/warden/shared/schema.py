"""JSON Schema 2020-12: validation issues that never echo values, and the
``x-warden-*`` markings (sensitive fields, model-hidden fields).

The plane validates input with these functions and the SDK validates output
with the same ones, so both sides report an issue identically.

Validation costs time linear in the instance, whatever it holds: patterns run
on RE2 (``warden.shared.patterns``), and ``uniqueItems`` compares items by
their JSON text instead of pair by pair.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import referencing
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator

from warden.shared.canonical import JSONValue
from warden.shared.patterns import PatternError, compile_pattern, search
from warden.shared.schema_predicate import (
    Predicate,
    compile_predicate,
    resolve_pointer,
    unique_key,
)

SENSITIVE: Final = "x-warden-sensitive"
MODEL_VISIBLE: Final = "x-warden-model-visible"
REDACTED: Final = "[REDACTED]"

Schema = Mapping[str, Any]


class InvalidSchemaError(ValueError):
    """A document is not a valid JSON Schema 2020-12."""


@dataclass(frozen=True, slots=True)
class Issue:
    """One validation problem: where it is and what is wrong, never the value."""

    path: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}


@dataclass(frozen=True, slots=True)
class SchemaValidator:
    """A schema's validator, built once per capability version: ``jsonschema``'s,
    and the schema compiled into one predicate that answers valid input
    quickly (None when the schema uses a keyword it does not cover)."""

    jsonschema: Validator
    accepts: Predicate | None


def compile_validator(schema: Schema) -> SchemaValidator:
    """Check a schema and build its validator (once per capability version).

    Raises:
        InvalidSchemaError: the schema itself is invalid, or uses a pattern
            RE2 cannot run (the message names where).
    """
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = _pointer(exc.absolute_path) or "/"
        raise InvalidSchemaError(f"invalid JSON Schema at {where}: {exc.message}") from None
    _check_markings(schema)
    _check_patterns(schema)
    anchors = set(_anchors(schema))
    for where, keyword, ref in _refs(schema, ""):
        if not ref.startswith("#"):
            raise InvalidSchemaError(
                f"{keyword} {ref!r} at {where or '/'} is remote; put the schema under $defs"
            )
        pointer = ref == "#" or ref.startswith("#/")
        if (pointer and resolve_pointer(schema, ref) is None) or (
            not pointer and ref[1:] not in anchors
        ):
            raise InvalidSchemaError(f"{keyword} {ref!r} at {where or '/'} does not resolve")
    # An empty registry: a reference is resolved within the schema or not at
    # all, never retrieved (jsonschema would fetch a URL or read a file).
    validator: Validator = _LinearValidator(
        schema, format_checker=_FORMATS, registry=referencing.Registry()
    )
    return SchemaValidator(validator, compile_predicate(schema, _FORMATS))


# ---------------------------------------------------------------------------
# Linear-time keywords: jsonschema's own run ``pattern`` and
# ``patternProperties`` on Python's backtracking ``re``, and compare
# ``uniqueItems`` pair by pair.


def _pattern(validator: Any, pattern: str, instance: Any, schema: Schema) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not search(pattern, instance):
        yield ValidationError(f"does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Schema
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        compiled = compile_pattern(pattern)
        for name, value in instance.items():
            if compiled.search(name) is not None:
                yield from _descend(validator, value, subschema, path=name, schema_path=pattern)


# A ``false`` subschema's issue belongs to the value it refuses: jsonschema's
# ``descend`` leaves it at the parent (``properties: {"c": false}`` refusing
# ``{"c": 1}`` would read as an issue of the whole object), so the keywords
# that descend into a member or an item by name go through ``_descend``.


def _properties(
    validator: Any, properties: Mapping[str, Any], instance: Any, schema: Schema
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for name, subschema in properties.items():
        if name in instance:
            yield from _descend(validator, instance[name], subschema, path=name, schema_path=name)


def _prefix_items(
    validator: Any, prefix: Sequence[Any], instance: Any, schema: Schema
) -> Iterator[Any]:
    if not validator.is_type(instance, "array"):
        return
    for index, (item, subschema) in enumerate(zip(instance, prefix, strict=False)):
        yield from _descend(validator, item, subschema, path=index, schema_path=index)


def _descend(
    validator: Any, instance: Any, subschema: Any, *, path: str | int, schema_path: str | int
) -> Iterator[Any]:
    if subschema is False:
        yield ValidationError(
            "is not allowed",
            validator="false",
            validator_value=None,
            instance=instance,
            schema=False,
            path=(path,),
            schema_path=(schema_path,),
        )
        return
    yield from validator.descend(instance, subschema, path=path, schema_path=schema_path)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Schema
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    extras = _extra_properties(schema, instance)
    if validator.is_type(additional, "object"):
        for name in extras:
            yield from validator.descend(instance[name], additional, path=name)
    elif not additional and extras:
        yield ValidationError("additional properties are not allowed")


def _extra_properties(schema: Schema, instance: Mapping[str, Any]) -> list[str]:
    """The names neither ``properties`` nor ``patternProperties`` cover."""
    known = _mapping(schema.get("properties"))
    patterns = [compile_pattern(p) for p in _mapping(schema.get("patternProperties"))]
    return [
        name
        for name in instance
        if name not in known and not any(p.search(name) is not None for p in patterns)
    ]


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Schema) -> Iterator[Any]:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[str] = set()
    for item in instance:
        key = unique_key(item)
        if key in seen:
            yield ValidationError("has non-unique elements")
            return
        seen.add(key)


def _is_regex(instance: object) -> bool:
    if isinstance(instance, str):
        compile_pattern(instance)
    return True


_FORMATS: Final = FormatChecker(formats=())
_FORMATS.checkers = {
    **Draft202012Validator.FORMAT_CHECKER.checkers,
    "regex": (_is_regex, PatternError),
}
_LinearValidator: Final = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    {
        "pattern": _pattern,
        "properties": _properties,
        "prefixItems": _prefix_items,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "uniqueItems": _unique_items,
    },
)

_SUBSCHEMA: Final = frozenset(
    {
        "items",
        "contains",
        "not",
        "if",
        "then",
        "else",
        "additionalProperties",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
_SUBSCHEMA_LISTS: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SUBSCHEMA_MAPS: Final = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def _subschemas(schema: object, where: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every schema object in a schema document, with its JSON Pointer; values
    of ``enum``, ``const``, ``default`` and the like are data, not schemas."""
    if not isinstance(schema, Mapping):
        return
    yield where, schema
    for keyword, value in schema.items():
        at = where + _pointer([keyword])
        if keyword in _SUBSCHEMA:
            yield from _subschemas(value, at)
        elif keyword in _SUBSCHEMA_LISTS and isinstance(value, list):
            for index, item in enumerate(value):
                yield from _subschemas(item, f"{at}/{index}")
        elif keyword in _SUBSCHEMA_MAPS and isinstance(value, Mapping):
            for name, item in value.items():
                yield from _subschemas(item, at + _pointer([name]))


def _check_markings(schema: Schema) -> None:
    """Refuse a marking that is not a boolean: ``1`` is true to Python and
    not to TypeScript, so one SDK would redact what the other shows (SI-5)."""
    for where, node in _subschemas(schema, ""):
        for marking in (SENSITIVE, MODEL_VISIBLE):
            if marking in node and not isinstance(node[marking], bool):
                raise InvalidSchemaError(
                    f"{marking} at {where or '/'} must be true or false, not {node[marking]!r}"
                )


def _check_patterns(schema: Schema) -> None:
    """Refuse a schema whose patterns RE2 cannot run, naming where they are."""
    problems = []
    pattern_properties = unevaluated = None
    for where, node in _subschemas(schema, ""):
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            try:
                compile_pattern(pattern)
            except PatternError as exc:
                problems.append(f"at {where}/pattern: {exc}")
        for name in _mapping(node.get("patternProperties")):
            try:
                compile_pattern(name)
            except PatternError as exc:
                problems.append(f"at {where}/patternProperties{_pointer([name])}: {exc}")
        if "patternProperties" in node:
            pattern_properties = pattern_properties or where + "/patternProperties"
        if "unevaluatedProperties" in node:
            unevaluated = unevaluated or where + "/unevaluatedProperties"
    if pattern_properties is not None and unevaluated is not None:
        # jsonschema finds the properties unevaluatedProperties leaves over with
        # Python's re; refusing the pair keeps every pattern on RE2.
        problems.append(
            f"at {unevaluated}: unevaluatedProperties cannot be combined with "
            f"patternProperties (at {pattern_properties}); use additionalProperties"
        )
    if problems:
        raise InvalidSchemaError("; ".join(problems))


def _refs(node: object, where: str) -> Iterator[tuple[str, str, str]]:
    """Every reference in a schema (``$ref``, ``$dynamicRef``): where, which, to what."""
    if isinstance(node, Mapping):
        for key, child in node.items():
            if key in ("$ref", "$dynamicRef") and isinstance(child, str):
                yield where, key, child
            else:
                yield from _refs(child, f"{where}/{key}")
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _refs(child, f"{where}/{index}")


def _anchors(node: object) -> Iterator[str]:
    """The names a schema gives its parts (``$anchor``, ``$dynamicAnchor``)."""
    if isinstance(node, Mapping):
        for key, child in node.items():
            if key in ("$anchor", "$dynamicAnchor") and isinstance(child, str):
                yield child
            else:
                yield from _anchors(child)
    elif isinstance(node, list):
        for child in node:
            yield from _anchors(child)


def validation_issues(validator: SchemaValidator, instance: JSONValue) -> list[Issue]:
    """Every issue of ``instance`` against the validator's schema, sorted.

    Messages are written from the schema alone, so no input value is echoed.
    Valid input is recognised by the compiled predicate; ``jsonschema`` runs
    only to name the issues of input it refuses.
    """
    if validator.accepts is not None and validator.accepts(instance):
        return []
    issues: set[Issue] = set()
    for error in validator.jsonschema.iter_errors(instance):
        issues.update(_issues_of(error))
    return sorted(issues, key=lambda issue: (issue.path, issue.message))


def _issues_of(error: ValidationError) -> Iterator[Issue]:
    path = list(error.absolute_path)
    # A ``false`` schema refuses everything; jsonschema names no keyword for it.
    keyword = "false" if error.validator is None else str(error.validator)
    value: Any = error.validator_value
    instance = error.instance
    if keyword == "required":
        present = instance if isinstance(instance, dict) else {}
        for name in value:
            if name not in present:
                yield Issue(_pointer([*path, name]), "is required")
        return
    if keyword in ("additionalProperties", "unevaluatedProperties") and isinstance(instance, dict):
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        for name in _extra_properties(schema, instance):
            yield Issue(_pointer([*path, name]), "is not an allowed property")
        return
    yield Issue(_pointer(path), _message(keyword, value))


def _message(keyword: str, value: Any) -> str:
    match keyword:
        case "type":
            names = value if isinstance(value, list) else [value]
            return "must be of type " + " or ".join(str(n) for n in names)
        case "enum":
            return "must be one of the allowed values: " + _short(value)
        case "const":
            return "must equal " + _short(value)
        case "minimum":
            return f"must be >= {value}"
        case "maximum":
            return f"must be <= {value}"
        case "exclusiveMinimum":
            return f"must be > {value}"
        case "exclusiveMaximum":
            return f"must be < {value}"
        case "multipleOf":
            return f"must be a multiple of {value}"
        case "minLength":
            return f"must be at least {value} characters long"
        case "maxLength":
            return f"must be at most {value} characters long"
        case "pattern":
            return f"must match the pattern {value!r}"
        case "format":
            return f"must be a valid {value}"
        case "minItems":
            return f"must have at least {value} items"
        case "maxItems":
            return f"must have at most {value} items"
        case "uniqueItems":
            return "must not contain duplicate items"
        case "minProperties":
            return f"must have at least {value} properties"
        case "maxProperties":
            return f"must have at most {value} properties"
        case "anyOf":
            return "must match at least one of the allowed forms"
        case "oneOf":
            return "must match exactly one of the allowed forms"
        case "not":
            return "must not match the excluded form"
        case "dependentRequired":
            return "is missing properties that other properties require"
        case "contains" | "minContains" | "maxContains":
            return "must contain the required items"
        case "propertyNames":
            return "has a property name that is not allowed"
        case "additionalProperties" | "unevaluatedProperties" | "additionalItems":
            return "has items or properties that are not allowed"
        case "false":
            return "is not allowed"
        case _:
            return f"does not satisfy '{keyword}'"


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pointer(parts: Iterable[object]) -> str:
    """An RFC 6901 JSON Pointer for a path into a document."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


# ---------------------------------------------------------------------------
# Markings: sensitive and model-hidden fields.

_DROP: Final = object()


def redact(
    value: JSONValue,
    schema: Schema,
    replace: Callable[[JSONValue], JSONValue] = lambda _: REDACTED,
) -> JSONValue:
    """A copy of ``value`` with every field marked ``x-warden-sensitive`` replaced.

    Markings are found through ``$ref``, ``$defs``, ``allOf``/``anyOf``/``oneOf``,
    properties, pattern and additional properties, and array items; where
    branches disagree, a field is sensitive if any branch marks it.
    """
    return _walk(value, [schema], schema, SENSITIVE, True, replace)


def marks_anything(schema: Schema, marking: str) -> bool:
    """Whether ``marking`` appears anywhere in ``schema``: when it does not, no
    value has a marked field (``redact`` and ``strip_model_hidden`` would copy
    it unchanged)."""
    pending: list[Any] = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, Mapping):
            if marking in node:
                return True
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return False


def strip_model_hidden(value: JSONValue, schema: Schema) -> JSONValue:
    """A copy of ``value`` without the fields marked ``x-warden-model-visible: false``
    (array items become null, keeping positions; a hidden root becomes None)."""
    stripped = _walk(value, [schema], schema, MODEL_VISIBLE, False, lambda _: _DROP)
    return None if stripped is _DROP else stripped


def _walk(
    value: JSONValue,
    schemas: list[Schema],
    root: Schema,
    marking: str,
    marked: object,
    replace: Callable[[JSONValue], JSONValue],
) -> JSONValue:
    expanded = _expand(schemas, root)
    if any(s.get(marking) == marked for s in expanded):
        return replace(value)
    if isinstance(value, dict):
        result = {}
        for key, child in value.items():
            new = _walk(child, _property_schemas(expanded, key), root, marking, marked, replace)
            if new is not _DROP:
                result[key] = new
        return result
    if isinstance(value, list):
        items = []
        for index, child in enumerate(value):
            new = _walk(child, _item_schemas(expanded, index), root, marking, marked, replace)
            items.append(None if new is _DROP else new)
        return items
    return value


def _expand(schemas: list[Schema], root: Schema) -> list[Schema]:
    """The schemas plus everything they include through $ref and combinators."""
    out: list[Schema] = []
    pending = list(schemas)
    seen: set[int] = set()
    while pending:
        schema = pending.pop()
        if not isinstance(schema, Mapping) or id(schema) in seen:
            continue
        seen.add(id(schema))
        out.append(schema)
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            target = _resolve(root, ref)
            if target is not None:
                pending.append(target)
        for combinator in ("allOf", "anyOf", "oneOf"):
            branches = schema.get(combinator)
            if isinstance(branches, list):
                pending.extend(b for b in branches if isinstance(b, Mapping))
        for conditional in ("then", "else"):
            branch = schema.get(conditional)
            if isinstance(branch, Mapping):
                pending.append(branch)
    return out


def _resolve(root: Schema, ref: str) -> Schema | None:
    node = resolve_pointer(root, ref)
    return node if isinstance(node, Mapping) else None


def _property_schemas(schemas: list[Schema], key: str) -> list[Schema]:
    found: list[Schema] = []
    for schema in schemas:
        properties = _mapping(schema.get("properties"))
        if key in properties:
            found.append(properties[key])
            continue
        matched = [
            s for p, s in _mapping(schema.get("patternProperties")).items() if _matches(p, key)
        ]
        found.extend(matched)
        extra = schema.get("additionalProperties")
        if not matched and isinstance(extra, Mapping):
            found.append(extra)
    return found


def _item_schemas(schemas: list[Schema], index: int) -> list[Schema]:
    found: list[Schema] = []
    for schema in schemas:
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        if index < len(prefix):
            found.append(prefix[index])
        elif isinstance(schema.get("items"), Mapping):
            found.append(schema["items"])
    return found


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _matches(pattern: object, key: str) -> bool:
    """Whether a patternProperties pattern matches; one RE2 cannot compile
    counts as matching, so a marking under it is never lost."""
    if not isinstance(pattern, str):
        return False
    try:
        return search(pattern, key)
    except PatternError:
        return True
