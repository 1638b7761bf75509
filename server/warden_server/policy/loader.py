"""Load a policy folder: read, parse, validate, type-check, compile — and
report every problem at once, each as ``file:line:col: path: message``, in a
stable order (file, line, column).

A folder is read once into a ``PolicySource`` (names and bytes, hence its
revision), then compiled from exactly those bytes: what is hashed is what
is checked and what runs.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ValidationError

from warden_server.config import did_you_mean
from warden_server.policy import typecheck, variables, yamlpos
from warden_server.policy.cel import CelPythonEvaluator, CompileError, Evaluator, Program
from warden_server.policy.definitions import Definitions, Expansion, identity, line_column
from warden_server.policy.engine import CompiledLimit, CompiledRule, PolicySet
from warden_server.policy.globs import WILDCARDS, matches
from warden_server.policy.inputs import InputSchema, missing_field
from warden_server.policy.model import (
    EXPRESSION_KEYS,
    LIMIT_EXPRESSION_KEYS,
    Limit,
    PolicyFile,
    Rule,
    parse_duration,
)

MAX_EXPRESSION_CHARS: Final = 10_000
MAX_EXPRESSION_NODES: Final = 4000
MAX_EXPRESSION_DEPTH: Final = 400
MAX_COMPREHENSION_NESTING: Final = 2
POLICY_SUFFIXES: Final = (".yaml", ".yml")
_HIDE_READS_INPUT: Final = "hide rules run before input validation and cannot read 'input'"


@dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One problem in one policy (or policy test) file."""

    file: str
    line: int
    """1 and up; 0 with ``column`` 0 when the problem is with the folder or the
    file as a whole (it cannot be read), which has no position."""
    column: int
    path: str
    """Where in the document, e.g. ``rules[2].when``; empty for the whole file."""
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        at = f":{self.line}:{self.column}" if self.line else ""  # 0: the folder or file whole
        return f"{self.file}{at}: {where}{self.message}"

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "path": self.path,
            "message": self.message,
        }


class PolicyLoadError(Exception):
    """A policy set has problems; it never replaces the last good set (SI-12)."""

    def __init__(self, problems: list[Problem], revision: str = "", files: Sequence[str] = ()):
        self.problems = sorted(problems)
        self.revision = revision
        """The content hash of what was read, when the folder could be read."""
        self.files = tuple(files)
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass(frozen=True, slots=True)
class PolicySource:
    """A policy folder as read at one moment: every policy file's name and bytes."""

    directory: Path
    files: tuple[tuple[str, bytes], ...]
    revision: str

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.files)


def policy_files(directory: Path) -> list[Path]:
    """The policy files of a folder (its tests/ subfolder holds tests, not rules)."""
    return sorted(p for p in directory.iterdir() if p.suffix in POLICY_SUFFIXES and p.is_file())


def revision_of(files: Sequence[tuple[str, bytes]]) -> str:
    """The content hash of a policy set: names and bytes of every file."""
    h = hashlib.sha256()
    for name, content in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(content).digest())
    return h.hexdigest()


def read_policy_folder(directory: str | Path) -> PolicySource:
    """Read every policy file of ``directory`` once.

    Raises:
        PolicyLoadError: the folder or one of its files cannot be read.
    """
    directory = Path(directory)
    try:
        paths = policy_files(directory)
    except OSError as exc:
        reason = "no such policy folder" if not directory.exists() else exc.strerror
        raise PolicyLoadError([Problem(str(directory), 0, 0, "", str(reason))]) from None
    files = []
    for path in paths:
        try:
            files.append((path.name, path.read_bytes()))
        except OSError as exc:
            # A file removed between listing and reading: the folder is mid-change.
            raise PolicyLoadError([Problem(str(path), 0, 0, "", str(exc.strerror))]) from None
    return PolicySource(directory, tuple(files), revision_of(files))


def compile_policies(
    source: PolicySource,
    *,
    default_effect: Literal["allow", "deny"] = "deny",
    evaluator: Evaluator | None = None,
    capabilities: Sequence[InputSchema] = (),
    reuse: PolicySet | None = None,
) -> PolicySet:
    """Check and compile a policy folder as read.

    Args:
        source: The folder's files.
        default_effect: The decision when no rule matches.
        evaluator: The CEL evaluator (the reference one by default).
        capabilities: Known capabilities' input schemas: when given, every
            ``input.x`` a rule reads must be declared by a capability it matches.
        reuse: The set in force: an expression it compiled already (with the
            same evaluator) is not compiled again. Programs are immutable, and
            checking still runs for every expression, so this changes no result.

    Raises:
        PolicyLoadError: any problem in any file (all of them, sorted).
    """
    evaluator = evaluator or CelPythonEvaluator()
    index = SchemasByGlob(capabilities)
    types = typecheck.TypeChecker() if typecheck.available() is None else None
    programs = _programs_of(reuse) if reuse and reuse.evaluator.name == evaluator.name else {}
    problems: list[Problem] = []
    rules: list[CompiledRule] = []
    limits: list[CompiledLimit] = []
    ids: list[tuple[str, str, str, yamlpos.Position]] = []
    for name, raw in source.files:
        checker = _FileChecker(
            str(source.directory / name), evaluator, index, problems, programs, types
        )
        rules.extend(checker.check(raw))
        limits.extend(checker.limits)
        ids.extend(checker.ids)
    first_seen: dict[str, tuple[str, yamlpos.Position]] = {}
    for rule_id, file, path, position in ids:
        if rule_id in first_seen:
            other_file, other = first_seen[rule_id]
            problems.append(
                Problem(
                    file,
                    position.line,
                    position.column,
                    path,
                    f"duplicate {'limit' if path.startswith('limits') else 'rule'} id "
                    f"{rule_id!r} (first defined at "
                    f"{other_file}:{other.line}:{other.column})",
                )
            )
        else:
            first_seen[rule_id] = (file, position)
    if problems:
        raise PolicyLoadError(problems, source.revision, source.names)
    return PolicySet(
        revision=source.revision,
        rules=tuple(rules),
        files=source.names,
        evaluator=evaluator,
        default_effect=default_effect,
        limits=tuple(limits),
    )


def _programs_of(policies: PolicySet) -> dict[str, Program]:
    programs: dict[str, Program] = {}
    for compiled in policies.rules:
        for key, program in (
            ("when", compiled.when),
            ("message_expr", compiled.message_expr),
            ("approvers", compiled.approvers),
        ):
            text = compiled.text(key)
            if program is not None and text is not None:
                programs[text] = program
    for limit in policies.limits:
        for key, found in (("when", limit.when), ("key", limit.key), ("cost", limit.cost)):
            text = limit.text(key)
            if found is not None and text is not None:
                programs[text] = found
    return programs


def load_policies(
    directory: str | Path,
    *,
    default_effect: Literal["allow", "deny"] = "deny",
    evaluator: Evaluator | None = None,
    capabilities: Sequence[InputSchema] = (),
) -> PolicySet:
    """Read, check and compile every policy file in ``directory``.

    Raises:
        PolicyLoadError: any problem in any file (all of them, sorted).
    """
    return compile_policies(
        read_policy_folder(directory),
        default_effect=default_effect,
        evaluator=evaluator,
        capabilities=capabilities,
    )


def validation_problems(
    file: str,
    document: yamlpos.Document,
    error: ValidationError,
    prefix: yamlpos.Path = (),
    model: type[BaseModel] | None = None,
) -> list[Problem]:
    """A pydantic validation error as problems, each at its place in the
    document; an unknown key of ``model`` (the document's) names the key it
    most resembles."""
    problems = []
    for item in error.errors():
        loc: yamlpos.Path = (*prefix, *item["loc"])
        unknown = item["type"] == "extra_forbidden"
        position = document.key_position(loc) if unknown else document.position(loc)
        message = _pydantic_message(item)
        if unknown and model is not None:
            message += did_you_mean(model, tuple(item["loc"]))
        problems.append(Problem(file, position.line, position.column, dotted(loc), message))
    return problems


def dotted(path: Sequence[Any]) -> str:
    """A document path as authors write it: ``rules[2].when``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class SchemasByGlob:
    """The input schemas whose capability ids some glob matches.

    Ids are kept sorted, so a glob is tried only against the ids that start
    with its literal prefix (``orders.`` for ``orders.*``): a set of thousands
    of rules over thousands of capabilities is checked without comparing
    every rule with every capability.
    """

    def __init__(self, schemas: Sequence[InputSchema]) -> None:
        order = sorted(range(len(schemas)), key=lambda i: schemas[i].capability_id)
        self._schemas = schemas
        self._order = order
        self._ids = [schemas[i].capability_id for i in order]
        self._found: dict[str, list[int]] = {}
        self._declared: set[tuple[str, tuple[str, ...]]] = set()
        """(schema content, field path) found declared: a large set's rules
        read the same few fields of schemas alike again and again."""

    def matching(self, globs: Sequence[str]) -> list[InputSchema]:
        """The schemas any of ``globs`` matches, in the order they were given."""
        positions = sorted({p for glob in globs for p in self._positions(glob)})
        return [self._schemas[p] for p in positions]

    def missing_field(self, schemas: Sequence[InputSchema], path: tuple[str, ...]) -> str | None:
        """Why the first of ``schemas`` that does not declare ``input.<path>``
        lacks it, or None when all declare it."""
        for schema in schemas:
            key = (schema.shape, path)
            if key in self._declared:
                continue
            missing = missing_field([schema], path)
            if missing is not None:
                return missing
            self._declared.add(key)
        return None

    def _positions(self, glob: str) -> list[int]:
        found = self._found.get(glob)
        if found is None:
            cut = min((glob.index(c) for c in WILDCARDS if c in glob), default=len(glob))
            prefix = glob[:cut]
            start = bisect.bisect_left(self._ids, prefix)
            found = []
            for i in range(start, len(self._ids)):
                if not self._ids[i].startswith(prefix):
                    break
                if matches(self._ids[i], glob):
                    found.append(self._order[i])
            self._found[glob] = found
        return found


class _FileChecker:
    """Checks one policy file, adding its problems to a shared list."""

    def __init__(
        self,
        file: str,
        evaluator: Evaluator,
        capabilities: SchemasByGlob,
        problems: list[Problem],
        programs: dict[str, Program],
        types: typecheck.TypeChecker | None,
    ) -> None:
        self.types = types
        """The type checker; None where cel-expr-python is missing."""
        self.programs = programs
        """Compiled programs by expression text, shared by the files of a set."""
        self.file = file
        self.evaluator = evaluator
        self.capabilities = capabilities
        self.problems = problems
        self.ids: list[tuple[str, str, str, yamlpos.Position]] = []
        """(id, file, path, position) of every rule and limit that parsed."""
        self.limits: list[CompiledLimit] = []
        """The limits of the file that compiled."""
        self.document = yamlpos.Document(data=None)
        self.texts: dict[yamlpos.Path, str] = {}
        """The text of every expression of the file, by path: to place a
        problem found in an expansion where it was written."""
        self.definitions = Definitions({}, {}, self._problem_at_offset)

    def problem(self, path: yamlpos.Path, message: str, at: yamlpos.Position | None = None) -> None:
        position = at or self.document.position(path)
        problem = Problem(self.file, position.line, position.column, dotted(path), message)
        # A variable used by several rules would repeat its problems.
        if problem not in self.problems:
            self.problems.append(problem)

    def _problem_at_offset(self, path: yamlpos.Path, offset: int, message: str) -> None:
        if offset < 0 or path not in self.texts:
            self.problem(path, message)
            return
        line, column = line_column(self.texts[path], offset)
        self.problem(path, message, self.document.position_in(path, line, column))

    def _at(
        self, expansion: Expansion, line: int, column: int
    ) -> tuple[yamlpos.Path, yamlpos.Position]:
        """Where (``line``, ``column``) of an expanded expression was written."""
        path, offset = expansion.origin(line, column)
        text = self.texts.get(path, "")
        inner_line, inner_column = line_column(text, offset)
        return path, self.document.position_in(path, inner_line, inner_column)

    def _definitions(self, constants: Any, found: Any) -> None:
        """Read the file's constants and variables, and check each variable."""
        constants = constants if isinstance(constants, Mapping) else {}
        found = found if isinstance(found, Mapping) else {}
        texts = {
            name: str(text).lower() if isinstance(text, bool) else text
            for name, text in found.items()
            if isinstance(name, str) and isinstance(text, str | bool)
        }
        self.definitions = Definitions(constants, texts, self._problem_at_offset)
        for name, text in texts.items():
            path: yamlpos.Path = ("variables", name)
            self.texts[path] = text
        self.definitions.check_constants()
        for name in self.definitions.variable_names:
            path = ("variables", name)
            if self.definitions.parses(name):
                expansion = self.definitions.variable(name)
            else:  # compiled as written, so that the syntax error is reported
                expansion = identity(path, self.texts[path])
            if expansion is not None:
                allowed = variables.WHEN | variables.APPROVERS
                self._expression(path, expansion, allowed, (), "variable")

    def check(self, raw: bytes) -> list[CompiledRule]:
        """Check and compile the file: its rules that compiled (its limits in
        ``limits``, every problem in ``problems``). Called once per checker."""
        try:
            return self._check(raw)
        finally:
            # The definitions report through a method of this checker: left in
            # place, that cycle would keep the file's parsed document (a tuple
            # per node) alive until the cycle collector ran.
            del self.definitions

    def _check(self, raw: bytes) -> list[CompiledRule]:
        try:
            self.document = yamlpos.load(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            self.problem((), f"not UTF-8 text: {exc.reason}", yamlpos.Position(1, 1))
            return []
        except yamlpos.YAMLSyntaxError as exc:
            self.problem((), str(exc), exc.position)
            return []
        for path, position in self.document.duplicates:
            self.problem(path, "duplicate key", position)
        data = self.document.data if self.document.data is not None else {}
        try:
            parsed = PolicyFile.model_validate(data)
        except ValidationError as exc:
            self.problems.extend(
                validation_problems(self.file, self.document, exc, model=PolicyFile)
            )
            if isinstance(data, Mapping):
                self._definitions(data.get("constants"), data.get("variables"))
            self._check_what_parsed(data, exc)
            return []
        self._definitions(parsed.constants, parsed.variables)
        compiled = []
        for index, rule in enumerate(parsed.rules):
            rule_compiled = self._rule(index, rule)
            if rule_compiled is not None:
                compiled.append(rule_compiled)
        for index, limit in enumerate(parsed.limits):
            limit_compiled = self._limit(index, limit)
            if limit_compiled is not None:
                self.limits.append(limit_compiled)
        return compiled

    def _check_what_parsed(self, data: Any, error: ValidationError) -> None:
        """Keep checking the rules and limits of a file whose structure is broken
        elsewhere, so that one mistake does not hide the others: each entry
        that parsed is checked whole, and the expressions of each that did not."""
        if not isinstance(data, Mapping):
            return
        for section, keys in (("rules", EXPRESSION_KEYS), ("limits", LIMIT_EXPRESSION_KEYS)):
            entries = data.get(section)
            if not isinstance(entries, list):
                continue
            broken = {
                e["loc"][1] for e in error.errors() if e["loc"][:1] == (section,) and e["loc"][1:]
            }
            for index, raw in enumerate(entries):
                if index not in broken:
                    if section == "rules":
                        self._rule(index, Rule.model_validate(raw))
                    else:
                        self._limit(index, Limit.model_validate(raw))
                elif isinstance(raw, Mapping):
                    hide = section == "rules" and raw.get("effect") == "hide"
                    for key in keys:
                        text = raw.get(key)
                        if isinstance(text, str):
                            kind: typecheck.Kind = key  # type: ignore[assignment]
                            path: yamlpos.Path = (section, index, key)
                            self.texts[path] = text
                            expansion = self.definitions.expand(path, text)
                            if expansion is not None:
                                self._expression(path, expansion, _allowed(key, hide), (), kind)

    def _rule(self, index: int, rule: Rule) -> CompiledRule | None:
        base: yamlpos.Path = ("rules", index)
        before = len(self.problems)
        id_path: yamlpos.Path = (*base, "id")
        self.ids.append((rule.id, self.file, dotted(id_path), self.document.position(id_path)))
        schemas = self.capabilities.matching(rule.capabilities)
        hide = rule.effect == "hide"
        texts: dict[str, str] = {}

        def compiled(key: typecheck.Kind, text: str, allowed: frozenset[str]) -> Program | None:
            path: yamlpos.Path = (*base, key)
            self.texts[path] = text
            expansion = self.definitions.expand(path, text)
            if expansion is None:
                return None
            if expansion.text != text:
                texts[key] = expansion.text
            return self._expression(path, expansion, allowed, schemas, key)

        when = compiled("when", rule.when, _allowed("when", hide))
        message_expr = None
        if rule.message_expr is not None:
            message_expr = compiled("message_expr", rule.message_expr, variables.WHEN)
        approvers = None
        if rule.effect == "require_approval":
            approvers = compiled("approvers", rule.approvers or "true", variables.APPROVERS)
        else:
            for key in ("approvers", "ttl"):
                if getattr(rule, key) is not None:
                    self.problem(
                        (*base, key),
                        f"'{key}' applies only to require_approval rules",
                        self.document.key_position((*base, key)),
                    )
        if rule.effect in ("allow", "hide"):
            # No model ever sees it: an allow answers nothing, a hide "not found".
            for key in ("message", "message_expr"):
                if getattr(rule, key) is not None:
                    self.problem(
                        (*base, key),
                        f"'{key}' applies only to deny and require_approval rules",
                        self.document.key_position((*base, key)),
                    )
        if when is None or len(self.problems) > before:
            return None
        return CompiledRule(
            rule=rule,
            file=self.file,
            line=self.document.position(base).line,
            when=when,
            message_expr=message_expr,
            approvers=approvers,
            ttl_seconds=parse_duration(rule.ttl) if rule.ttl else None,
            texts=texts,
        )

    def _limit(self, index: int, limit: Limit) -> CompiledLimit | None:
        base: yamlpos.Path = ("limits", index)
        before = len(self.problems)
        id_path: yamlpos.Path = (*base, "id")
        self.ids.append((limit.id, self.file, dotted(id_path), self.document.position(id_path)))
        schemas = self.capabilities.matching(limit.capabilities)
        texts: dict[str, str] = {}

        def compiled(key: typecheck.Kind, text: str | None) -> Program | None:
            if text is None:
                return None
            path: yamlpos.Path = (*base, key)
            self.texts[path] = text
            expansion = self.definitions.expand(path, text)
            if expansion is None:
                return None
            if expansion.text != text:
                texts[key] = expansion.text
            return self._expression(path, expansion, variables.WHEN, schemas, key)

        when = compiled("when", limit.when)
        key = compiled("key", limit.key)
        cost = compiled("cost", limit.cost)
        if when is None or len(self.problems) > before:
            return None
        return CompiledLimit(
            limit=limit,
            file=self.file,
            line=self.document.position(base).line,
            when=when,
            key=key,
            cost=cost,
            texts=texts,
        )

    def _expression(
        self,
        path: yamlpos.Path,
        expansion: Expansion,
        allowed: frozenset[str],
        schemas: Sequence[InputSchema],
        kind: typecheck.Kind,
    ) -> Program | None:
        text = expansion.text
        if len(text) > MAX_EXPRESSION_CHARS:
            self.problem(
                path,
                f"expression exceeds the cost limit ({len(text)} characters; "
                f"limit {MAX_EXPRESSION_CHARS})",
            )
            return None
        program = self.programs.get(text)
        if program is None:
            try:
                program = self.evaluator.compile(text)
            except CompileError as exc:
                self.problem(*self._placed(path, expansion, exc.line, exc.column, str(exc)))
                return None
            self.programs[text] = program
        before = len(self.problems)
        reported: set[str] = set()
        for ref in program.references:
            name = ref.variable
            if name not in allowed and name not in variables.CEL_TYPE_NAMES:
                if name not in reported:
                    reported.add(name)
                    if name == "input" and allowed == variables.HIDE:
                        message = _HIDE_READS_INPUT
                    else:
                        message = (
                            f"unknown variable {name!r} (available: {', '.join(sorted(allowed))})"
                        )
                    self.problem(*self._placed(path, expansion, ref.line, ref.column, message))
            elif name in variables.FIELDS and ref.path:
                fields = variables.FIELDS[name]
                if ref.path[0] not in fields:
                    message = (
                        f"{name}.{ref.path[0]}: {name} has no field {ref.path[0]!r} "
                        f"(fields: {', '.join(fields)})"
                    )
                    self.problem(*self._placed(path, expansion, ref.line, ref.column, message))
            elif name == "input" and ref.path:
                # Every capability the rule matches must have the field: a
                # call to one without it would fail to evaluate.
                missing = self.capabilities.missing_field(schemas, ref.path)
                if missing is not None:
                    self.problem(*self._placed(path, expansion, ref.line, ref.column, missing))
        self._cost(path, program)
        if self.types is not None and len(self.problems) == before:
            for found in self.types.check(text, kind, schemas, program.references):
                self.problem(
                    *self._placed(path, expansion, found.line, found.column, found.message)
                )
        return program

    def _placed(
        self, used: yamlpos.Path, expansion: Expansion, line: int, column: int, message: str
    ) -> tuple[yamlpos.Path, str, yamlpos.Position]:
        """A problem at (``line``, ``column``) of the expansion of the expression
        at ``used``, placed where it was written: in a variable, it names the use."""
        path, position = self._at(expansion, line, column)
        if path != used and used[:1] == ("rules",):
            # Said once without the use when the variable alone has the problem.
            alone = Problem(self.file, position.line, position.column, dotted(path), message)
            if alone not in self.problems:
                message = f"{message} (where {dotted(used)} uses it)"
        return path, message, position

    def _cost(self, path: yamlpos.Path, program: Program) -> None:
        over = []
        if program.size > MAX_EXPRESSION_NODES:
            over.append(f"{program.size} syntax nodes (limit {MAX_EXPRESSION_NODES})")
        if program.depth > MAX_EXPRESSION_DEPTH:
            over.append(f"nesting depth {program.depth} (limit {MAX_EXPRESSION_DEPTH})")
        if program.comprehension_depth > MAX_COMPREHENSION_NESTING:
            over.append(
                f"comprehensions nested {program.comprehension_depth} deep "
                f"(limit {MAX_COMPREHENSION_NESTING})"
            )
        if over:
            self.problem(path, f"expression exceeds the cost limit: {'; '.join(over)}")


def _allowed(key: str, hide: bool) -> frozenset[str]:
    if key == "approvers":
        return variables.APPROVERS
    return variables.HIDE if hide and key == "when" else variables.WHEN


def _pydantic_message(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    message = str(error["msg"])
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "missing required key"
    if kind == "literal_error":
        return message.replace("Input should be", "must be")
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    if kind in ("model_type", "dict_type"):
        return "must be a mapping"
    if kind == "list_type":
        return "must be a list"
    if kind == "string_type":
        return "must be a string"
    return message.replace("Input should", "should").replace("List should", "should")
