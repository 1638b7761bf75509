"""A JSON Schema compiled into one Python predicate: is this instance valid?

Validation runs for every call's input on the plane and every handler's
output in the SDK, and nearly all of it is valid. ``jsonschema`` walks the
schema anew for each instance, building a validator object per level; a
closure tree built once per schema answers the same question in a tenth of
the time. Only when it answers "no" does ``jsonschema`` run, to name the
issues (``warden.shared.schema.validation_issues``), so every issue reported
is still jsonschema's own.

The predicate covers the keywords generated schemas use (pydantic's, the
TypeScript SDK's). A schema with any other keyword, or a ``$ref`` it cannot
follow, gets no predicate (``compile_predicate`` returns None) and is
validated by ``jsonschema`` alone: never a keyword skipped, never a
different verdict. Property tests hold the predicate to ``jsonschema``'s
verdict on generated schemas and instances.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable, Mapping
from typing import Any, Final
from urllib.parse import unquote

from jsonschema import FormatChecker

from warden.shared.patterns import compile_pattern

Predicate = Callable[[Any], bool]

ANNOTATIONS: Final = frozenset(
    {
        "$schema",
        "$comment",
        "$defs",
        "definitions",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentMediaType",
        "contentEncoding",
        "discriminator",
    }
)
"""Keywords that never change a verdict (in 2020-12, content* annotate only).
Keywords starting ``x-`` are Warden's own markings, annotations too."""


class _Unsupported(Exception):
    """The schema uses something the predicate does not cover."""


def compile_predicate(schema: object, formats: FormatChecker) -> Predicate | None:
    """The predicate of ``schema`` (already checked as valid JSON Schema
    2020-12), or None when it uses a keyword the predicate does not cover."""
    try:
        return _Compiler(schema, formats).compile(schema)
    except _Unsupported:
        return None
    except RecursionError:
        return None


class _Compiler:
    def __init__(self, root: object, formats: FormatChecker) -> None:
        self._root = root
        self._formats = formats
        self._refs: dict[str, list[Predicate]] = {}

    def compile(self, node: object) -> Predicate:
        if node is True:
            return _always
        if node is False:
            return _never
        if not isinstance(node, Mapping):
            raise _Unsupported
        checks: list[Predicate] = []
        kinds: tuple[str, ...] | None = None
        for keyword, value in node.items():
            if keyword in ANNOTATIONS or keyword.startswith("x-"):
                continue
            if keyword == "type":
                kinds = (value,) if isinstance(value, str) else tuple(value)
                continue
            build = _KEYWORDS.get(keyword)
            if build is None:
                raise _Unsupported
            check = build(self, value, node)
            if check is not None:
                checks.append(check)
        if kinds is not None:
            checks.insert(0, _type_check(kinds))
        if not checks:
            return _always
        if len(checks) == 1:
            return checks[0]
        if len(checks) == 2:
            first, second = checks
            return lambda value: first(value) and second(value)
        frozen = tuple(checks)
        return lambda value: all(check(value) for check in frozen)

    # -- keywords ----------------------------------------------------------

    def ref(self, target: object, node: Mapping[str, Any]) -> Predicate:
        if not isinstance(target, str) or not target.startswith("#"):
            raise _Unsupported
        cell = self._refs.get(target)
        if cell is None:
            cell = self._refs[target] = []
            if target != "#" and not target.startswith("#/"):
                raise _Unsupported  # an anchor, not a pointer
            cell.append(self.compile(resolve_pointer(self._root, target)))
        if cell:
            return cell[0]
        # A reference from inside the schema it names, still being compiled:
        # looked up when called.
        return lambda value: cell[0](value)  # noqa: PLW0108

    def properties(self, value: object, node: Mapping[str, Any]) -> Predicate:
        if not isinstance(value, Mapping):
            raise _Unsupported
        compiled = tuple((name, self.compile(sub)) for name, sub in value.items())

        def check(instance: Any) -> bool:
            if not isinstance(instance, dict):
                return True
            for name, predicate in compiled:
                if name in instance and not predicate(instance[name]):
                    return False
            return True

        return check

    def additional_properties(self, value: object, node: Mapping[str, Any]) -> Predicate:
        if "patternProperties" in node:
            raise _Unsupported
        known = frozenset(node.get("properties") or ())
        if value is True:
            return _always
        extra = self.compile(value)

        def check(instance: Any) -> bool:
            if not isinstance(instance, dict):
                return True
            return all(name in known or extra(item) for name, item in instance.items())

        return check

    def items(self, value: object, node: Mapping[str, Any]) -> Predicate:
        start = len(node.get("prefixItems") or ())
        each = self.compile(value)

        def check(instance: Any) -> bool:
            if not isinstance(instance, list):
                return True
            return all(each(item) for item in instance[start:])

        return check

    def prefix_items(self, value: object, node: Mapping[str, Any]) -> Predicate:
        if not isinstance(value, list):
            raise _Unsupported
        compiled = tuple(self.compile(sub) for sub in value)

        def check(instance: Any) -> bool:
            if not isinstance(instance, list):
                return True
            return all(predicate(item) for predicate, item in zip(compiled, instance, strict=False))

        return check

    def any_of(self, value: object, node: Mapping[str, Any]) -> Predicate:
        branches = self._branches(value)
        return lambda instance: any(branch(instance) for branch in branches)

    def all_of(self, value: object, node: Mapping[str, Any]) -> Predicate:
        branches = self._branches(value)
        return lambda instance: all(branch(instance) for branch in branches)

    def one_of(self, value: object, node: Mapping[str, Any]) -> Predicate:
        branches = self._branches(value)
        return lambda instance: sum(1 for branch in branches if branch(instance)) == 1

    def not_(self, value: object, node: Mapping[str, Any]) -> Predicate:
        inner = self.compile(value)
        return lambda instance: not inner(instance)

    def format(self, value: object, node: Mapping[str, Any]) -> Predicate | None:
        if not isinstance(value, str) or value not in self._formats.checkers:
            return None  # an unknown format is an annotation, as jsonschema has it
        formats = self._formats
        return lambda instance: formats.conforms(instance, value)

    def _branches(self, value: object) -> tuple[Predicate, ...]:
        if not isinstance(value, list) or not value:
            raise _Unsupported
        return tuple(self.compile(sub) for sub in value)


def resolve_pointer(root: object, ref: str) -> object | None:
    """The node a local ``$ref`` names (``#`` and a JSON Pointer after it,
    percent-encoded as a URI fragment), or None when nothing is there."""
    if ref != "#" and not ref.startswith("#/"):
        return None  # an anchor's name, not a pointer
    node = root
    for raw in ref.removeprefix("#").split("/")[1:]:
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


# -- keywords without subschemas -----------------------------------------------


def _always(instance: Any) -> bool:
    return True


def _never(instance: Any) -> bool:
    return False


# The types as jsonschema's 2020-12 type checker has them.


def _is_number(instance: Any) -> bool:
    kind = type(instance)
    if kind is int or kind is float:
        return True
    return kind is not bool and isinstance(instance, numbers.Number)


def _is_integer(instance: Any) -> bool:
    # 1.0 is an integer, true is not.
    if isinstance(instance, bool):
        return False
    return isinstance(instance, int) or (isinstance(instance, float) and instance.is_integer())


_TYPES: Final[dict[str, Predicate]] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "number": _is_number,
    "integer": _is_integer,
}


def _type_check(kinds: tuple[str, ...]) -> Predicate:
    try:
        checks = tuple(_TYPES[kind] for kind in kinds)
    except KeyError:
        raise _Unsupported from None
    if len(checks) == 1:
        return checks[0]
    return lambda value: any(check(value) for check in checks)


def _enum(value: object, node: Mapping[str, Any]) -> Predicate:
    """Only enums of strings and nulls: other values compare by JSON Schema's
    equality (``1`` equals ``1.0``, ``true`` does not equal ``1``), which
    Python's ``==`` does not follow."""
    if not isinstance(value, list) or not all(v is None or type(v) is str for v in value):
        raise _Unsupported
    texts = frozenset(v for v in value if v is not None)
    null = None in value
    return lambda v: (type(v) is str and v in texts) or (null and v is None)


def _const(value: object, node: Mapping[str, Any]) -> Predicate:
    return _enum([value], node)


def _bound(compare: Callable[[Any, Any], bool]) -> Callable[[object, Any], Predicate]:
    def build(limit: object, node: Mapping[str, Any]) -> Predicate:
        if not _is_number(limit):
            raise _Unsupported
        return lambda v: not _is_number(v) or compare(v, limit)

    return build


def _size(
    kind: type[str] | type[list[Any]], compare: Callable[[int, int], bool]
) -> Callable[[object, Any], Predicate]:
    """``minLength`` and the like (``kind`` str) or ``minItems`` (``kind`` list)."""

    def build(limit: object, node: Mapping[str, Any]) -> Predicate:
        if type(limit) is not int:
            raise _Unsupported
        return lambda v: not isinstance(v, kind) or compare(len(v), limit)

    return build


def _pattern(value: object, node: Mapping[str, Any]) -> Predicate:
    if not isinstance(value, str):
        raise _Unsupported
    compiled = compile_pattern(value)
    return lambda v: not isinstance(v, str) or compiled.search(v) is not None


def _required(value: object, node: Mapping[str, Any]) -> Predicate:
    if not isinstance(value, list):
        raise _Unsupported
    names = tuple(value)
    return lambda v: not isinstance(v, dict) or all(name in v for name in names)


def _unique_items(value: object, node: Mapping[str, Any]) -> Predicate | None:
    if not value:
        return None

    def check(instance: Any) -> bool:
        if not isinstance(instance, list):
            return True
        texts = {unique_key(item) for item in instance}
        return len(texts) == len(instance)

    return check


def unique_key(item: Any) -> str:
    """The text two items share exactly when JSON Schema holds them equal."""
    return json.dumps(equality_form(item), sort_keys=True, separators=(",", ":"))


def equality_form(value: Any) -> Any:
    """``value`` with integral floats as integers: JSON Schema equality holds
    ``1`` and ``1.0`` equal, and ``true`` and ``1`` apart, as their JSON texts then do."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: equality_form(item) for key, item in value.items()}
    if isinstance(value, list):
        return [equality_form(item) for item in value]
    return value


_KEYWORDS: Final[dict[str, Callable[..., Predicate | None]]] = {
    "$ref": _Compiler.ref,
    "properties": _Compiler.properties,
    "additionalProperties": _Compiler.additional_properties,
    "items": _Compiler.items,
    "prefixItems": _Compiler.prefix_items,
    "anyOf": _Compiler.any_of,
    "allOf": _Compiler.all_of,
    "oneOf": _Compiler.one_of,
    "not": _Compiler.not_,
    "format": _Compiler.format,
}
_PLAIN_KEYWORDS: Final[dict[str, Callable[[Any, Mapping[str, Any]], Predicate | None]]] = {
    "enum": _enum,
    "const": _const,
    "minimum": _bound(lambda v, limit: v >= limit),
    "maximum": _bound(lambda v, limit: v <= limit),
    "exclusiveMinimum": _bound(lambda v, limit: v > limit),
    "exclusiveMaximum": _bound(lambda v, limit: v < limit),
    "minLength": _size(str, lambda n, limit: n >= limit),
    "maxLength": _size(str, lambda n, limit: n <= limit),
    "minItems": _size(list, lambda n, limit: n >= limit),
    "maxItems": _size(list, lambda n, limit: n <= limit),
    "pattern": _pattern,
    "required": _required,
    "uniqueItems": _unique_items,
}
for _name, _build in _PLAIN_KEYWORDS.items():
    _KEYWORDS[_name] = lambda compiler, value, node, _build=_build: _build(value, node)
