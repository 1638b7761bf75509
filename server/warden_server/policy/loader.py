"""Load a policy folder: parse, validate, compile — and report every problem
at once, each as ``file:line:col: path: message``, in a stable order."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import ValidationError

from warden_server.policy import yamlpos
from warden_server.policy.cel import CelPythonEvaluator, CompileError, Evaluator, Program
from warden_server.policy.engine import CompiledRule, PolicySet
from warden_server.policy.model import PolicyFile, Rule, parse_duration

WHEN_VARIABLES: Final = frozenset({"actor", "capability", "input", "context", "now"})
HIDE_VARIABLES: Final = WHEN_VARIABLES - {"input"}
APPROVER_VARIABLES: Final = frozenset({"approver", "requester", "capability", "input"})
MAX_EXPRESSION_NODES: Final = 4000
MAX_EXPRESSION_DEPTH: Final = 400
POLICY_SUFFIXES: Final = (".yaml", ".yml")


@dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One problem in one policy file."""

    file: str
    line: int
    column: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.file}:{self.line}:{self.column}: {where}{self.message}"


class PolicyLoadError(Exception):
    """A policy set has problems; it never replaces the last good set (SI-12)."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def policy_files(directory: Path) -> list[Path]:
    """The policy files of a folder (its tests/ subfolder holds tests, not rules)."""
    return sorted(p for p in directory.iterdir() if p.suffix in POLICY_SUFFIXES and p.is_file())


def revision_of(files: list[tuple[str, bytes]]) -> str:
    """The content hash of a policy set: names and bytes of every file."""
    h = hashlib.sha256()
    for name, content in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(content).digest())
    return h.hexdigest()


def load_policies(
    directory: str | Path,
    *,
    default_effect: Literal["allow", "deny"] = "deny",
    evaluator: Evaluator | None = None,
) -> PolicySet:
    """Load, check and compile every policy file in ``directory``.

    Raises:
        PolicyLoadError: any problem in any file (all of them, sorted).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise PolicyLoadError([Problem(str(directory), 1, 1, "", "no such policy folder")])
    evaluator = evaluator or CelPythonEvaluator()
    problems: list[Problem] = []
    rules: list[CompiledRule] = []
    contents: list[tuple[str, bytes]] = []
    for path in policy_files(directory):
        raw = path.read_bytes()
        contents.append((path.name, raw))
        rules.extend(_load_file(path, raw, evaluator, problems))
    first_seen: dict[str, CompiledRule] = {}
    for rule in rules:
        if rule.id in first_seen:
            other = first_seen[rule.id]
            problems.append(
                Problem(
                    rule.file,
                    rule.line,
                    1,
                    "",
                    f"duplicate rule id {rule.id!r} (first defined at {other.file}:{other.line})",
                )
            )
        else:
            first_seen[rule.id] = rule
    if problems:
        raise PolicyLoadError(problems)
    return PolicySet(
        revision=revision_of(contents),
        rules=tuple(rules),
        files=tuple(name for name, _ in contents),
        evaluator=evaluator,
        default_effect=default_effect,
    )


def _load_file(
    path: Path, raw: bytes, evaluator: Evaluator, problems: list[Problem]
) -> list[CompiledRule]:
    name = str(path)
    try:
        document = yamlpos.load(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        problems.append(Problem(name, 1, 1, "", f"not UTF-8 text: {exc.reason}"))
        return []
    except yamlpos.YAMLSyntaxError as exc:
        problems.append(Problem(name, exc.position.line, exc.position.column, "", str(exc)))
        return []
    for dup_path, position in document.duplicates:
        problems.append(
            Problem(name, position.line, position.column, _dotted(dup_path), "duplicate key")
        )
    data = document.data if document.data is not None else {}
    try:
        parsed = PolicyFile.model_validate(data)
    except ValidationError as exc:
        for error in exc.errors():
            loc = tuple(error["loc"])
            position = document.position(loc)
            problems.append(
                Problem(
                    name, position.line, position.column, _dotted(loc), _pydantic_message(error)
                )
            )
        return []
    compiled = []
    for index, rule in enumerate(parsed.rules):
        base: yamlpos.Path = ("rules", index)
        before = len(problems)
        rule_compiled = _compile_rule(name, rule, base, document, evaluator, problems)
        if rule_compiled is not None and len(problems) == before:
            compiled.append(rule_compiled)
    return compiled


def _compile_rule(
    file: str,
    rule: Rule,
    base: yamlpos.Path,
    document: yamlpos.Document,
    evaluator: Evaluator,
    problems: list[Problem],
) -> CompiledRule | None:
    def problem(key: str, message: str, line_offset: int = 0, column: int | None = None) -> None:
        position = document.position((*base, key))
        problems.append(
            Problem(
                file,
                position.line + line_offset,
                column if column is not None else position.column,
                _dotted((*base, key)),
                message,
            )
        )

    def compile_expr(key: str, text: str, allowed: frozenset[str]) -> Program | None:
        try:
            program = evaluator.compile(text)
        except CompileError as exc:
            path = (*base, key)
            position = document.position(path)
            style = document.styles.get(path)
            if style in ("|", ">"):
                problem(key, str(exc), line_offset=exc.line, column=exc.column)
            else:
                quote = 1 if style in ("'", '"') else 0
                column = position.column + quote + exc.column - 1 if exc.line == 1 else exc.column
                problem(key, str(exc), line_offset=exc.line - 1, column=column)
            return None
        unknown = sorted(program.free_variables - allowed)
        if unknown:
            problem(
                key,
                f"unknown variable{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(unknown)} (available: {', '.join(sorted(allowed))})",
            )
        if program.size > MAX_EXPRESSION_NODES or program.depth > MAX_EXPRESSION_DEPTH:
            problem(
                key,
                f"expression exceeds the cost limit ({program.size} nodes, depth "
                f"{program.depth}; limits {MAX_EXPRESSION_NODES} and "
                f"{MAX_EXPRESSION_DEPTH})",
            )
        return program

    is_hide = rule.effect == "hide"
    when = compile_expr("when", rule.when, HIDE_VARIABLES if is_hide else WHEN_VARIABLES)
    if is_hide and when is not None and "input" in when.free_variables:
        problem("when", "hide rules run before input validation and cannot use 'input'")
    message_expr = (
        compile_expr("message_expr", rule.message_expr, WHEN_VARIABLES)
        if rule.message_expr
        else None
    )
    approvers = None
    if rule.effect == "require_approval":
        approvers = compile_expr("approvers", rule.approvers or "true", APPROVER_VARIABLES)
    else:
        for key in ("approvers", "ttl"):
            if getattr(rule, key) is not None:
                problem(key, f"'{key}' applies only to require_approval rules")
    if when is None:
        return None
    return CompiledRule(
        rule=rule,
        file=file,
        line=document.position(base).line,
        when=when,
        message_expr=message_expr,
        approvers=approvers,
        ttl_seconds=parse_duration(rule.ttl) if rule.ttl else None,
    )


def _dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _pydantic_message(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "missing required key"
    if kind == "literal_error":
        return str(error["msg"]).replace("Input should be", "must be")
    return str(error["msg"])
