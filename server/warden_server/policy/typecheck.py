"""Type-checking policy expressions against declared types (SPEC §6).

Every variable an expression reads has a declared type: ``actor``,
``approver`` and ``requester`` are actors (``id`` string, ``roles`` list of
strings, ``tenant`` string, ``attrs`` map), ``capability`` has fixed fields,
``context`` is a map of dynamic values, ``now`` a timestamp, and ``input``
is typed from the input JSON Schema of each capability the rule's globs
match. The expression is checked once per matching schema by Google's CEL
type checker (``cel-expr-python``), whose structs are protobuf messages: the
schemas are turned into messages here, field by field.

What a JSON Schema cannot prove is typed ``dyn`` and checked no further: a
union of types, a free-form object, a field whose name is not an identifier.
``enum`` and ``format`` narrow nothing. A nullable scalar is CEL's wrapper
type (the value or null).

Constant sub-expressions are evaluated once here: one that always fails
(``1/0``, ``matches(x, "[")`` with an invalid pattern) is an error too.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

import lark
from google.protobuf import descriptor_pb2, descriptor_pool, struct_pb2, wrappers_pb2

from warden_server.policy.cel import parse
from warden_server.policy.inputs import InputSchema, missing_field

if TYPE_CHECKING:
    from warden_server.policy.engine import PolicySet

try:
    from cel_expr_python import cel
except ImportError:  # pragma: no cover - the wheel exists for the platforms CI runs on
    cel = None

Kind = Literal["when", "message_expr", "approvers", "variable", "constant", "key", "cost"]

PACKAGE: Final = "policy"
MAX_SCHEMA_DEPTH: Final = 16
"""How deep nested objects are typed; deeper ones are free-form maps."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED: Final = frozenset(
    [
        "as",
        "break",
        "const",
        "continue",
        "else",
        "false",
        "for",
        "function",
        "if",
        "import",
        "in",
        "let",
        "loop",
        "package",
        "namespace",
        "null",
        "return",
        "true",
        "var",
        "void",
        "while",
    ]
)
_ERROR_LINE = re.compile(r"ERROR: <input>:(\d+):(\d+): (.*)")
_OVERLOAD = re.compile(r"found no matching overload for '([^']*)' applied to '(.*)'$")
_UNDEFINED_FIELD = re.compile(r"undefined field '([^']*)' not found in struct '([^']*)'")
_UNDECLARED = re.compile(r"undeclared reference to '([^']*)'")
_OPERATORS: Final = {
    "_>_": ">",
    "_<_": "<",
    "_>=_": ">=",
    "_<=_": "<=",
    "_==_": "==",
    "_!=_": "!=",
    "_+_": "+",
    "_-_": "-",
    "_*_": "*",
    "_/_": "/",
    "_%_": "%",
    "_&&_": "&&",
    "_||_": "||",
    "!_": "!",
    "-_": "-",
    "_[_]": "[]",
    "@in": "in",
    "_?_:_": "?:",
}
_EXPECTED: Final[Mapping[str, str]] = {
    "when": "bool",
    "approvers": "bool",
    "message_expr": "string",
    "key": "string",
    "cost": "number",
}
_ACTOR_FIELDS: Final = {
    "id": "a string",
    "roles": "a list of strings",
    "tenant": "a string",
    "attrs": "a map",
}
_CAPABILITY_FIELDS: Final = {
    "id": "a string",
    "version": "a string",
    "service": "a string",
    "side_effect": "a string",
    "tags": "a list of strings",
}


def available() -> str | None:
    """None when expressions can be type-checked, else why not."""
    return None if cel is not None else "the package cel-expr-python is not installed"


@dataclass(frozen=True, slots=True)
class TypeProblem:
    """One type error, at ``line``/``column`` (1-based) within the expression."""

    line: int
    column: int
    message: str


@dataclass(slots=True)
class _Typed:
    """One capability's input schema as a protobuf message, and what each
    field path is, in words, for messages."""

    schema: InputSchema | None
    env: Any
    shape: str = ""
    """The schema's content (its JSON, keys sorted): schemas alike type alike."""
    fields: dict[tuple[str, ...], str] = field(default_factory=dict)
    messages: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Message full name → the input path it types."""

    @property
    def where(self) -> str:
        if self.schema is None:
            return ""
        version = f" v{self.schema.version}" if self.schema.version else ""
        return f"{self.schema.capability_id}{version}"


class TypeChecker:
    """Checks expressions against the declared types and a set of input schemas.

    Built once per policy load; each schema becomes a message type the first
    time a rule matching it is checked.
    """

    def __init__(self, extra: Mapping[str, Any] | None = None) -> None:
        problem = available()
        if problem is not None:
            raise RuntimeError(problem)
        self._pool = descriptor_pool.DescriptorPool()
        for module in (struct_pb2, wrappers_pb2):
            self._pool.Add(
                descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
            )
        self._pool.Add(_fixed_types())
        self._extra = dict(extra or {})
        """More declared variables (name → CEL type), e.g. a file's ``v`` and ``c``."""
        self._typed: dict[tuple[str, str, int], _Typed] = {}
        self._shapes: dict[str, _Typed] = {}
        """Each distinct schema's message type, by its ``shape``."""
        self._untyped: _Typed | None = None
        self._counter = itertools.count(1)
        self._clean: set[tuple[str, str, str]] = set()
        """(text, kind, schema shape) found well-typed: capabilities that share
        an input schema need the check once."""

    def with_variables(self, extra: Mapping[str, Any]) -> TypeChecker:
        """A checker sharing this one's message types, with more variables declared."""
        other = TypeChecker.__new__(TypeChecker)
        other._pool = self._pool
        other._extra = {**self._extra, **extra}
        other._typed = {}
        other._shapes = {}
        other._untyped = None
        other._counter = self._counter
        other._clean = set()
        return other

    def check(
        self, text: str, kind: Kind, schemas: Sequence[InputSchema], references: Sequence[Any]
    ) -> list[TypeProblem]:
        """Every type error of ``text`` against each schema (or against an
        untyped ``input`` when none is given), then its constant failures."""
        problems: list[TypeProblem] = []
        seen: set[tuple[int, int]] = set()
        for typed in [self._typed_for(s) for s in schemas] or [self._untyped_input()]:
            checked = (text, kind, typed.shape)
            if checked in self._clean:
                continue
            found = self._check_one(text, kind, typed, references)
            if not found:
                self._clean.add(checked)
            for problem in found:
                if (problem.line, problem.column) not in seen:
                    seen.add((problem.line, problem.column))
                    problems.append(problem)
        if not problems:
            problems.extend(constant_failures(text))
        return problems

    def result_type(self, text: str, schemas: Sequence[InputSchema]) -> Any:
        """The CEL type of a well-typed expression (for ``variables:``): the
        type under the first schema, or dyn when the schemas disagree."""
        types = {
            typed.env.compile(text).return_type().name(): typed.env.compile(text).return_type()
            for typed in [self._typed_for(s) for s in schemas] or [self._untyped_input()]
        }
        return next(iter(types.values())) if len(types) == 1 else cel.Type.DYN

    def _check_one(
        self, text: str, kind: Kind, typed: _Typed, references: Sequence[Any]
    ) -> list[TypeProblem]:
        try:
            expression = typed.env.compile(text)
        except Exception as exc:  # the binding raises plain exceptions for every kind
            return [
                TypeProblem(line, column, self._words(message, typed, references, line, column))
                for line, column, message in _errors(str(exc))
            ]
        expected = _EXPECTED.get(kind)
        if expected is None:
            return []
        found = expression.return_type()
        wanted = {
            "bool": (cel.Type.BOOL,),
            "string": (cel.Type.STRING,),
            "number": (cel.Type.INT, cel.Type.UINT, cel.Type.DOUBLE),
        }[expected]
        if found in (*wanted, cel.Type.DYN):
            return []
        name = _type_words(_type_name(found), typed)
        where = f" in {typed.where}" if typed.where and "input" in text else ""
        return [TypeProblem(1, 1, f"'{kind}' must be a {expected}, found {name}{where}")]

    def _words(
        self, message: str, typed: _Typed, references: Sequence[Any], line: int, column: int
    ) -> str:
        """A checker message as an author reads it."""
        if match := _OVERLOAD.search(message):
            name, arguments = match.groups()
            operator = _OPERATORS.get(name)
            what = f"operator '{operator}'" if operator else f"function '{name}'"
            text = f"no {what} for {_type_words(arguments, typed)}"
            hint = self._hint(typed, references, line, column)
            return f"{text}: {hint}" if hint else text
        if match := _UNDEFINED_FIELD.search(message):
            name, struct = match.groups()
            owner = self._owner(struct, typed)
            return f"{owner} has no field '{name}'"
        if match := _UNDECLARED.search(message):
            return f"unknown name '{match.group(1)}'"
        return message

    def _owner(self, struct: str, typed: _Typed) -> str:
        if struct == f"{PACKAGE}.Actor":
            return "an actor"
        if struct == f"{PACKAGE}.Capability":
            return "capability"
        path = typed.messages.get(struct)
        if path is not None:
            return f"{'.'.join(('input', *path))} in {typed.where}"
        return "this object"

    def _hint(self, typed: _Typed, references: Sequence[Any], line: int, column: int) -> str | None:
        """What the field read nearest the error is: the fact that explains it."""
        best: tuple[int, str] | None = None
        for ref in references:
            if ref.line != line or not ref.path:
                continue
            words = self._field_words(typed, ref.variable, ref.path)
            if words is None:
                continue
            distance = abs(ref.column - column)
            if best is None or distance < best[0]:
                name = ".".join((ref.variable, *ref.path))
                best = (distance, f"{name} is {words}")
        if best is None:
            return None
        if best[1].startswith("input.") and typed.where:
            return f"{best[1]} in {typed.where}"
        return best[1]

    def _field_words(self, typed: _Typed, variable: str, path: tuple[str, ...]) -> str | None:
        if variable in ("actor", "approver", "requester") and len(path) == 1:
            return _ACTOR_FIELDS.get(path[0])
        if variable == "capability" and len(path) == 1:
            return _CAPABILITY_FIELDS.get(path[0])
        if variable == "input":
            return typed.fields.get(path)
        return None

    def _declared(self, input_type: Any) -> dict[str, Any]:
        actor = cel.Type(f"{PACKAGE}.Actor")
        return {
            "actor": actor,
            "approver": actor,
            "requester": actor,
            "capability": cel.Type(f"{PACKAGE}.Capability"),
            "context": cel.Type.Map(cel.Type.STRING, cel.Type.DYN),
            "now": cel.Type.TIMESTAMP,
            "input": input_type,
            **self._extra,
        }

    def _untyped_input(self) -> _Typed:
        if self._untyped is None:
            env = cel.NewEnv(
                descriptor_pool=self._pool,
                variables=self._declared(cel.Type.Map(cel.Type.STRING, cel.Type.DYN)),
            )
            self._untyped = _Typed(None, env)
        return self._untyped

    def _typed_for(self, schema: InputSchema) -> _Typed:
        key = (schema.capability_id, schema.version, id(schema.schema))
        typed = self._typed.get(key)
        if typed is None:
            typed = self._build(schema)
            self._typed[key] = typed
        return typed

    def _build(self, schema: InputSchema) -> _Typed:
        """``schema``'s message type, made once per distinct schema: the
        capabilities that share one (often most of a service's) share it."""
        built = self._shapes.get(schema.shape)
        if built is None:
            built = self._shapes[schema.shape] = self._message_type(schema.schema, schema.shape)
        return _Typed(schema, built.env, schema.shape, built.fields, built.messages)

    def _message_type(self, schema: Any, shape: str) -> _Typed:
        package = f"{PACKAGE}.i{next(self._counter)}"
        file = descriptor_pb2.FileDescriptorProto(
            name=f"{package.replace('.', '/')}.proto", package=package, syntax="proto3"
        )
        file.dependency.extend(["google/protobuf/struct.proto", "google/protobuf/wrappers.proto"])
        builder = _Builder(schema, package)
        root = builder.shape(schema, 0)
        typed = _Typed(None, None, shape=shape)
        if isinstance(root, _Object):
            message = file.message_type.add(name="Input")
            builder.fill(message, root, f".{package}.Input", (), 0)
            try:
                self._pool.Add(file)
                input_type = cel.Type(f"{package}.Input")
                typed.fields = builder.fields
                typed.messages = builder.messages
            except Exception:  # a schema protobuf cannot express (clashing names, say)
                input_type = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
        else:
            input_type = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
        typed.env = cel.NewEnv(descriptor_pool=self._pool, variables=self._declared(input_type))
        return typed


def rules_broken_by(policies: PolicySet, schemas: Sequence[InputSchema]) -> list[str]:
    """The rules in force that would no longer type-check were ``schemas``
    the input schemas of their capabilities: each as ``file:line: rule 'id':
    key: problem``. Empty where types cannot be checked."""
    if available() is not None or not schemas:
        return []
    checker = TypeChecker()
    broken: list[str] = []
    for schema in schemas:
        for rule in policies.rules_for(schema.capability_id):
            for kind, text, program in (
                ("when", rule.text("when"), rule.when),
                ("message_expr", rule.text("message_expr"), rule.message_expr),
                ("approvers", rule.text("approvers"), rule.approvers),
            ):
                if program is None or text is None:
                    continue
                if kind == "when" and rule.rule.effect == "hide":
                    continue  # hide rules read no input
                found = checker.check(text, kind, [schema], program.references)  # type: ignore[arg-type]
                found += [
                    TypeProblem(1, 1, message)
                    for ref in program.references
                    if ref.variable == "input" and ref.path
                    for message in [missing_field([schema], ref.path)]
                    if message is not None
                ]
                for problem in found[:1]:
                    broken.append(
                        f"{rule.file}:{rule.line}: rule {rule.id!r}: {kind}: {problem.message}"
                    )
    return broken


# --- Numbers as the checker types them ---------------------------------------


@dataclass(frozen=True, slots=True)
class _Doubles:
    """Where an input's numbers are doubles: this value (``fields`` None, no
    ``each``), the named fields of an object, or each item or map value."""

    fields: Mapping[str, _Doubles] | None = None
    each: _Doubles | None = None

    def apply(self, value: Any) -> Any:
        if self.fields is None and self.each is None:
            return float(value) if type(value) is int else value
        if self.fields is not None:
            if not isinstance(value, dict):
                return value
            fields = self.fields
            return {k: fields[k].apply(v) if k in fields else v for k, v in value.items()}
        each = self.each
        assert each is not None
        if isinstance(value, list):
            return [each.apply(v) for v in value]
        if isinstance(value, dict):
            return {k: each.apply(v) for k, v in value.items()}
        return value


_DOUBLE: Final = _Doubles()


def number_typing(schema: Mapping[str, Any]) -> Callable[[Any], Any] | None:
    """How an input gets the types the checker gave it: every integer where
    ``schema`` says ``number`` made a double; None when it says so nowhere
    the checker types (the input is typed as it is).

    JSON has one number type: ``100.0`` arrives as ``100`` (and reads back so
    from its canonical form), while the checker types a ``number`` field
    ``double`` and has rules compare it with doubles (``input.price * 1.2``),
    which an int would fail to evaluate. Where the checker proves no type
    (``dyn``: a union, a free-form object, a list of lists) nothing changes.
    """
    builder = _Builder(schema, PACKAGE)
    root = builder.shape(schema, 0)
    doubles = _doubles(builder, root, 0) if isinstance(root, _Object) else None
    return doubles.apply if doubles is not None else None


def _doubles(builder: _Builder, shape: _Shape, depth: int) -> _Doubles | None:
    """Where ``shape`` (a field's, at ``depth``) holds doubles, as ``_Builder.fill`` types it."""
    if isinstance(shape, _Scalar):
        return _DOUBLE if shape.kind == "number" else None
    if isinstance(shape, _Object):
        fields = {}
        for name, schema in shape.properties:
            child = _doubles(builder, builder.shape(schema, depth + 1), depth + 1)
            if child is not None:
                fields[name] = child
        return _Doubles(fields=fields) if fields else None
    inner = shape.items if isinstance(shape, _List) else getattr(shape, "values", None)
    if isinstance(inner, _Scalar | _Object):  # a list or map of them; others are dyn
        each = _doubles(builder, inner, depth)
        return _Doubles(each=each) if each is not None else None
    return None


# --- JSON Schema to protobuf -------------------------------------------------


ScalarKind = Literal["string", "integer", "number", "boolean"]
_SCALAR_KINDS: Final[Mapping[str, ScalarKind]] = {
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
}


@dataclass(frozen=True, slots=True)
class _Scalar:
    kind: ScalarKind
    nullable: bool = False


@dataclass(frozen=True, slots=True)
class _Object:
    properties: tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class _List:
    items: Any


@dataclass(frozen=True, slots=True)
class _Map:
    values: Any


@dataclass(frozen=True, slots=True)
class _Free:
    """An object whose fields are not declared: map(string, dyn)."""


@dataclass(frozen=True, slots=True)
class _Dyn:
    """Any value: the schema proves no one type."""


_Shape = _Scalar | _Object | _List | _Map | _Free | _Dyn
_F = descriptor_pb2.FieldDescriptorProto
_SCALARS: Final = {
    "string": ("TYPE_STRING", "StringValue", "a string"),
    "integer": ("TYPE_INT64", "Int64Value", "an integer"),
    "number": ("TYPE_DOUBLE", "DoubleValue", "a number (double)"),
    "boolean": ("TYPE_BOOL", "BoolValue", "a boolean"),
}


class _Builder:
    """Turns one JSON Schema into nested protobuf messages."""

    def __init__(self, root: Mapping[str, Any], package: str) -> None:
        self._root = root
        self._package = package
        self.fields: dict[tuple[str, ...], str] = {}
        self.messages: dict[str, tuple[str, ...]] = {}

    def shape(self, schema: Any, depth: int) -> _Shape:
        schema = self._resolved(schema)
        if not isinstance(schema, Mapping) or depth > MAX_SCHEMA_DEPTH:
            return _Dyn()
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = [o for o in schema[key] if not _is_null(self._resolved(o))]
                nullable = len(options) < len(schema[key])
                if len(options) != 1:
                    return _Dyn()
                inner = self.shape(
                    {**{k: v for k, v in schema.items() if k != key}, **options[0]}
                    if isinstance(options[0], Mapping)
                    else options[0],
                    depth + 1,
                )
                return _nullable(inner) if nullable else inner
        if "allOf" in schema:
            parts = [self._resolved(p) for p in schema["allOf"]]
            if not all(isinstance(p, Mapping) for p in parts):
                return _Dyn()
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            properties = dict(merged.get("properties") or {})
            for part in parts:
                if any(k in part for k in ("anyOf", "oneOf", "allOf", "$ref")):
                    return _Dyn()
                for k, v in part.items():
                    if k == "properties":
                        properties.update(v)
                    elif k in merged and merged[k] != v and k not in ("required", "description"):
                        return _Dyn()
                    else:
                        merged[k] = v
            if properties:
                merged["properties"] = properties
            return self.shape(merged, depth + 1)
        kinds = schema.get("type")
        if isinstance(kinds, list):
            rest = [k for k in kinds if k != "null"]
            if len(rest) != 1:
                return _Dyn()
            inner = self.shape({**schema, "type": rest[0]}, depth + 1)
            return _nullable(inner) if len(rest) < len(kinds) else inner
        if kinds is None:
            if "properties" in schema:
                kinds = "object"
            elif "enum" in schema or "const" in schema:
                kinds = _literal_kind(schema)
            if kinds is None:
                return _Dyn()
        scalar = _SCALAR_KINDS.get(kinds) if isinstance(kinds, str) else None
        if scalar is not None:
            return _Scalar(scalar)
        if kinds == "array":
            items = schema.get("items")
            return _List(self.shape(items, depth + 1) if items is not None else _Dyn())
        if kinds == "object":
            return self._object(schema, depth)
        return _Dyn()

    def _object(self, schema: Mapping[str, Any], depth: int) -> _Shape:
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        if schema.get("patternProperties"):
            return _Free()
        if not properties:
            if isinstance(extra, Mapping):
                return _Map(self.shape(extra, depth + 1))
            return _Free()
        if extra not in (None, False):
            return _Free()
        if not all(_IDENTIFIER.fullmatch(n) and n not in _RESERVED for n in properties):
            return _Free()
        return _Object(tuple(properties.items()))

    def fill(
        self,
        message: Any,
        shape: _Object,
        full_name: str,
        path: tuple[str, ...],
        depth: int,
    ) -> None:
        self.messages[full_name.lstrip(".")] = path
        for number, (name, schema) in enumerate(shape.properties, start=1):
            child = self.shape(schema, depth + 1)
            here = (*path, name)
            self.fields[here] = _words(child)
            entry = message.field.add(name=name, number=number, json_name=f"f{number}")
            self._field(entry, message, child, full_name, here, depth, name)

    def _field(
        self,
        entry: Any,
        message: Any,
        shape: _Shape,
        full_name: str,
        path: tuple[str, ...],
        depth: int,
        name: str,
    ) -> None:
        entry.label = _F.LABEL_OPTIONAL
        if isinstance(shape, _List):
            if isinstance(shape.items, _Scalar | _Object):
                entry.label = _F.LABEL_REPEATED
                self._single(entry, message, shape.items, full_name, path, depth, name)
            else:
                _message_field(entry, ".google.protobuf.ListValue")
            return
        if isinstance(shape, _Map):
            values = shape.values
            if not isinstance(values, _Scalar | _Object):
                _message_field(entry, ".google.protobuf.Struct")
                return
            map_entry = message.nested_type.add(name=f"{_camel(name)}Entry")
            map_entry.options.map_entry = True
            map_entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
            value = map_entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL)
            self._single(value, message, values, full_name, (*path, "*"), depth, name)
            entry.label = _F.LABEL_REPEATED
            _message_field(entry, f"{full_name}.{map_entry.name}")
            return
        self._single(entry, message, shape, full_name, path, depth, name)

    def _single(
        self,
        entry: Any,
        message: Any,
        shape: _Shape,
        full_name: str,
        path: tuple[str, ...],
        depth: int,
        name: str,
    ) -> None:
        if isinstance(shape, _Scalar):
            proto_type, wrapper, _ = _SCALARS[shape.kind]
            if shape.nullable:
                _message_field(entry, f".google.protobuf.{wrapper}")
            else:
                entry.type = getattr(_F, proto_type)
        elif isinstance(shape, _Object):
            nested = message.nested_type.add(name=f"{_camel(name)}Type")
            nested_name = f"{full_name}.{nested.name}"
            self.fill(nested, shape, nested_name, path, depth + 1)
            _message_field(entry, nested_name)
        elif isinstance(shape, _Free):
            _message_field(entry, ".google.protobuf.Struct")
        elif isinstance(shape, _List | _Map):
            _message_field(entry, ".google.protobuf.Value")
        else:
            _message_field(entry, ".google.protobuf.Value")

    def _resolved(self, schema: Any) -> Any:
        seen = 0
        while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str) and seen < 32:
            target = _pointer(self._root, schema["$ref"])
            if not isinstance(target, Mapping):
                return None
            schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
            seen += 1
        return schema


def _message_field(entry: Any, type_name: str) -> None:
    entry.type = _F.TYPE_MESSAGE
    entry.type_name = type_name


def _nullable(shape: _Shape) -> _Shape:
    if isinstance(shape, _Scalar):
        return _Scalar(shape.kind, nullable=True)
    return shape  # a message, list or map may be compared with null already


def _is_null(schema: Any) -> bool:
    return isinstance(schema, Mapping) and schema.get("type") == "null" and len(schema) == 1


def _literal_kind(schema: Mapping[str, Any]) -> str | None:
    """The one JSON type every ``enum``/``const`` value has, if there is one."""
    values = list(schema.get("enum") or []) + ([schema["const"]] if "const" in schema else [])
    if values and all(isinstance(v, bool) for v in values):
        return "boolean"
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "integer"
    if values and all(isinstance(v, str) for v in values):
        return "string"
    return None


def _pointer(root: Mapping[str, Any], ref: str) -> Any:
    if not ref.startswith("#"):
        return None
    node: Any = root
    for escaped in ref[1:].split("/")[1:]:
        part = escaped.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_")) or "F"


def _words(shape: _Shape) -> str:
    if isinstance(shape, _Scalar):
        words = _SCALARS[shape.kind][2]
        return f"{words} or null" if shape.nullable else words
    if isinstance(shape, _Object):
        return "an object"
    if isinstance(shape, _List):
        inner = _words(shape.items)
        return "a list" if isinstance(shape.items, _Dyn) else f"a list of {_plural(inner)}"
    if isinstance(shape, _Map | _Free):
        return "a map"
    return "of any type"


def _plural(words: str) -> str:
    for article in ("an ", "a "):
        if words.startswith(article):
            words = words[len(article) :]
    if words.endswith(" or null"):
        return words
    return words + "s"


def _fixed_types() -> Any:
    """The messages of the fixed variables: actors and capabilities."""
    file = descriptor_pb2.FileDescriptorProto(
        name=f"{PACKAGE}/fixed.proto", package=PACKAGE, syntax="proto3"
    )
    file.dependency.append("google/protobuf/struct.proto")
    actor = file.message_type.add(name="Actor")
    for number, (name, proto_type, repeated) in enumerate(
        (("id", "string", False), ("roles", "string", True), ("tenant", "string", False)),
        start=1,
    ):
        actor.field.add(
            name=name,
            number=number,
            type=getattr(_F, f"TYPE_{proto_type.upper()}"),
            label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
        )
    attrs = actor.field.add(name="attrs", number=4, label=_F.LABEL_OPTIONAL)
    _message_field(attrs, ".google.protobuf.Struct")
    capability = file.message_type.add(name="Capability")
    for number, name in enumerate(("id", "version", "service", "side_effect", "tags"), start=1):
        capability.field.add(
            name=name,
            number=number,
            type=_F.TYPE_STRING,
            label=_F.LABEL_REPEATED if name == "tags" else _F.LABEL_OPTIONAL,
        )
    return file


# --- messages -------------------------------------------------------------------


def _errors(text: str) -> Iterator[tuple[int, int, str]]:
    found = False
    for line in text.splitlines():
        match = _ERROR_LINE.search(line)
        if match:
            found = True
            message = re.sub(r"\s*\[INVALID_ARGUMENT\]$", "", match.group(3)).strip()
            yield int(match.group(1)), int(match.group(2)), message
    if not found:
        yield 1, 1, text.strip().removeprefix("INVALID_ARGUMENT: ")


def _type_name(kind: Any) -> str:
    name = str(kind.name())
    return name.lower() if name.isupper() else name


_TYPE_WORDS: Final = (
    (re.compile(r"\bgoogle\.protobuf\.Struct\b"), "map(string, dyn)"),
    (re.compile(r"\bgoogle\.protobuf\.ListValue\b"), "list(dyn)"),
    (re.compile(r"\bgoogle\.protobuf\.Value\b"), "dyn"),
    (re.compile(rf"\b{PACKAGE}\.Actor\b"), "actor"),
    (re.compile(rf"\b{PACKAGE}\.Capability\b"), "capability"),
    (re.compile(rf"\b{PACKAGE}\.i\d+\.[A-Za-z0-9_.]+"), "object"),
    (re.compile(r"\bwrapper\((\w+)\)"), r"\1 or null"),
    (re.compile(r"\bnull_type\b"), "null"),
)


def _type_words(text: str, typed: _Typed) -> str:
    for pattern, words in _TYPE_WORDS:
        text = pattern.sub(words, text)
    return text


# --- constants ------------------------------------------------------------------

_EXPRESSION_NODES: Final = frozenset(
    {
        "expr",
        "conditionalor",
        "conditionaland",
        "relation",
        "addition",
        "multiplication",
        "unary",
        "member",
        "primary",
    }
)


def constant_failures(text: str) -> list[TypeProblem]:
    """Sub-expressions that read no variable and fail whenever evaluated, and
    ``matches`` patterns that are not valid regular expressions.

    They depend on the text alone, and a large set repeats its conditions
    across namespaces, as successive loads of a folder repeat most of them:
    each text is parsed once per process."""
    found = _CONSTANT_FAILURES.get(text)
    if found is None:
        if len(_CONSTANT_FAILURES) >= 65_536:
            _CONSTANT_FAILURES.clear()
        found = _CONSTANT_FAILURES[text] = tuple(_constant_failures(text, _constant_env()))
    return list(found)


_CONSTANT_FAILURES: dict[str, tuple[TypeProblem, ...]] = {}


@functools.cache
def _constant_env() -> Any:
    """An environment that declares nothing, where constant expressions are
    evaluated (made once: the first environment costs about 40 ms)."""
    return cel.NewEnv()


def _constant_failures(text: str, env: Any) -> list[TypeProblem]:
    try:
        tree = parse(text)
    except Exception:  # syntax errors are the reference compiler's to report
        return []
    problems: list[TypeProblem] = []
    _constants(tree, text, env, problems)
    for node in tree.iter_subtrees():
        pattern = _regex_argument(node)
        if pattern is None:
            continue
        literal = text[pattern.meta.start_pos : pattern.meta.end_pos]
        error = _evaluate(env, f"''.matches({literal})")
        if error is not None:
            problems.append(
                TypeProblem(
                    pattern.meta.line,
                    pattern.meta.column,
                    f"{literal} is not a valid regular expression: "
                    f"{error.removeprefix('invalid regular expression: ')}",
                )
            )
    return problems


def _constants(node: lark.Tree[Any], text: str, env: Any, problems: list[TypeProblem]) -> None:
    """Report the smallest constant sub-expressions that fail."""
    if _is_constant(node) and node.data in _EXPRESSION_NODES:
        error = _evaluate(env, text[node.meta.start_pos : node.meta.end_pos])
        if error is None:
            return
        before = len(problems)
        for child in node.children:
            if isinstance(child, lark.Tree):
                _constants(child, text, env, problems)
        if len(problems) == before:
            snippet = text[node.meta.start_pos : node.meta.end_pos]
            problems.append(
                TypeProblem(node.meta.line, node.meta.column, f"{snippet} always fails: {error}")
            )
        return
    for child in node.children:
        if isinstance(child, lark.Tree):
            _constants(child, text, env, problems)


def _is_constant(node: lark.Tree[Any]) -> bool:
    return not any(sub.data in ("ident", "member_dot_arg") for sub in node.iter_subtrees())


def _evaluate(env: Any, text: str) -> str | None:
    """Why a constant expression fails, or None when it evaluates (or is not
    an expression on its own)."""
    try:
        value = env.compile(text).eval(data={})
    except Exception:
        return None
    if value.type() == cel.Type.ERROR:
        message = str(value.value())
        code, sep, rest = message.partition(": ")
        return rest if sep and code.isupper() else message
    return None


def _regex_argument(node: lark.Tree[Any]) -> lark.Tree[Any] | None:
    """The pattern of ``matches(x, "...")`` or ``x.matches("...")`` when it is a literal."""
    if node.data == "ident_arg" and str(node.children[0]) == "matches" and len(node.children) > 1:
        args = node.children[1]
        index = 1
    elif node.data == "member_dot_arg" and str(node.children[1]) == "matches":
        args = node.children[2] if len(node.children) > 2 else None
        index = 0
    else:
        return None
    if not isinstance(args, lark.Tree) or len(args.children) <= index:
        return None
    pattern = args.children[index]
    if not isinstance(pattern, lark.Tree) or not _is_constant(pattern):
        return None
    return pattern
