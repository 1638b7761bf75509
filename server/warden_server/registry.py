"""The capability registry: definitions, versions and namespace ownership (SI-7).

Versions are immutable. Registering an identical definition again is a no-op;
a changed definition is a new version — numbered by the plane when the service
gives no version, refused when the service reuses a version number.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Final, Literal

from warden.shared.canonical import (
    JSONLimitError,
    NotCanonicalizable,
    canonical_json,
    compact_json,
    digest,
    strict_loads,
)
from warden.shared.codes import CODES
from warden.shared.schema import (
    SENSITIVE,
    InvalidSchemaError,
    SchemaValidator,
    compile_validator,
    marks_anything,
)
from warden_server.auth.services import Service
from warden_server.config import LimitsSection
from warden_server.errors import Conflict, InvalidRequest, PermissionDenied, ResourceExhausted
from warden_server.records.events import AuditEvent, now_iso
from warden_server.store import CapabilityRecord, Store, WriteTransaction

SURFACES: Final = ("mcp", "openai", "direct")
SideEffect = Literal["read", "write", "idempotent"]
_ID = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
MAX_ID_LENGTH: Final = 200
"""Characters in a capability id at most."""
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ERROR_CODE = re.compile(r"^[A-Z][A-Z0-9_]{1,63}$")


@dataclass(frozen=True, slots=True)
class DeclaredError:
    code: str
    message: str
    retryable: bool = False


@dataclass(frozen=True, slots=True)
class CapabilityDefinition:
    """A capability as a service declares it (SPEC §5)."""

    id: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    side_effect: SideEffect
    version: str = ""
    description: str = ""
    errors: tuple[DeclaredError, ...] = ()
    timeout_ms: int = 0
    exposure: tuple[str, ...] = SURFACES
    required_roles: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["errors"] = [asdict(e) for e in self.errors]
        for key in ("exposure", "required_roles", "tags"):
            data[key] = list(data[key])
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CapabilityDefinition:
        return cls(
            id=data["id"],
            version=data["version"],
            description=data["description"],
            input_schema=data["input_schema"],
            output_schema=data["output_schema"],
            errors=tuple(DeclaredError(**e) for e in data["errors"]),
            side_effect=data["side_effect"],
            timeout_ms=data["timeout_ms"],
            exposure=tuple(data["exposure"]),
            required_roles=tuple(data["required_roles"]),
            tags=tuple(data["tags"]),
        )

    def content_digest(self) -> str:
        """The digest of everything but the version: equal digests, equal contracts."""
        data = self.to_json()
        data.pop("version")
        return digest(data)


@dataclass(frozen=True)
class Capability:
    """A registered version: the definition, its owner, its input validator."""

    definition: CapabilityDefinition
    service: str
    digest: str
    registered_at: str
    sensitive_input: bool = field(default=True, compare=False, repr=False)
    """Whether the input schema marks any field sensitive; when not, the input
    is stored as it came (nothing to redact)."""
    sensitive_output: bool = field(default=True, compare=False, repr=False)
    """The same of the output schema, for the outcome record's output."""

    @cached_property
    def input_validator(self) -> SchemaValidator:
        """The input schema's validator, built when first asked for: a plane
        starting over many versions reads their schemas (the rules are checked
        against them) long before it validates a call to each. Every stored
        schema was checked when it was registered (``check_definition``)."""
        return compile_validator(self.definition.input_schema)

    @cached_property
    def _number_typing(self) -> Callable[[Any], Any] | None:
        # Imported here: the audit commands read capabilities without the checker.
        from warden_server.policy.typecheck import number_typing

        return number_typing(self.definition.input_schema)

    def policy_input(self, value: Any) -> Any:
        """The validated input as policies see it: every integer where the
        input schema says ``number`` a double, as the checker typed it
        (``typecheck.number_typing``); the input itself is unchanged."""
        typing = self._number_typing
        return value if typing is None else typing(value)

    @property
    def id(self) -> str:
        return self.definition.id

    @property
    def version(self) -> str:
        return self.definition.version

    def to_cel(self) -> dict[str, Any]:
        d = self.definition
        return {
            "id": d.id,
            "version": d.version,
            "service": self.service,
            "side_effect": d.side_effect,
            "tags": list(d.tags),
        }

    def declared_error(self, code: str) -> DeclaredError | None:
        return next((e for e in self.definition.errors if e.code == code), None)


def is_capability_id(text: str) -> bool:
    """Whether ``text`` could name a capability: ``namespace.name``, lowercase,
    at most ``MAX_ID_LENGTH`` characters."""
    return len(text) <= MAX_ID_LENGTH and _ID.match(text) is not None


def recorded_capability_id(text: str) -> str:
    """A requested capability id as requests and records carry it: one too
    long to name a capability is cut, and marked cut with an ellipsis, which
    no id contains."""
    return text if len(text) <= MAX_ID_LENGTH else text[:MAX_ID_LENGTH] + "…"


def check_definition(definition: CapabilityDefinition) -> list[str]:
    """Every problem with a definition, each naming the field."""
    problems = []
    cid = recorded_capability_id(definition.id) or "<no id>"
    if not is_capability_id(definition.id):
        problems.append(
            f"{cid}: id must be namespace.name in lowercase letters, digits and "
            f"underscores, at most {MAX_ID_LENGTH} characters"
        )
    if definition.version and not _VERSION.match(definition.version):
        problems.append(f"{cid}: version {definition.version!r} must be 1-64 of [A-Za-z0-9._-]")
    for name, schema in (
        ("input_schema", definition.input_schema),
        ("output_schema", definition.output_schema),
    ):
        if not isinstance(schema, dict):
            problems.append(f"{cid}: {name} must be a JSON object")
            continue
        try:
            canonical_json(schema)
            compile_validator(schema)
        except NotCanonicalizable as exc:
            problems.append(f"{cid}: {name} has no canonical JSON form (RFC 8785): {exc}")
        except InvalidSchemaError as exc:
            problems.append(f"{cid}: {name}: {exc}")
    if definition.side_effect not in ("read", "write", "idempotent"):
        problems.append(f"{cid}: side_effect must be read, write or idempotent")
    if definition.timeout_ms < 0:
        problems.append(f"{cid}: timeout_ms must not be negative")
    unknown = sorted(set(definition.exposure) - set(SURFACES))
    if unknown:
        problems.append(f"{cid}: unknown surfaces {unknown} (known: {', '.join(SURFACES)})")
    seen = set()
    for error in definition.errors:
        if not _ERROR_CODE.match(error.code):
            problems.append(f"{cid}: declared error {error.code!r} must be UPPER_SNAKE_CASE")
        elif error.code in CODES:
            problems.append(f"{cid}: declared error {error.code} shadows a built-in code")
        elif error.code in seen:
            problems.append(f"{cid}: declared error {error.code} appears twice")
        if not error.message.strip():
            problems.append(f"{cid}: declared error {error.code} needs a message")
        seen.add(error.code)
    return problems


class Registry:
    """Registered capabilities, read through a cache of immutable versions."""

    def __init__(self, store: Store, limits: LimitsSection | None = None) -> None:
        self._store = store
        self._limits = limits or LimitsSection()
        self._cache: dict[tuple[str, str], Capability] = {}
        self._lock = threading.Lock()

    def register(
        self,
        service: Service,
        definitions: Sequence[CapabilityDefinition],
        refuse: Callable[[Sequence[CapabilityDefinition]], None] | None = None,
    ) -> list[Capability]:
        """Register definitions all or nothing.

        Raises:
            InvalidRequest: a definition is malformed (every problem listed).
            PermissionDenied: an id outside the service's namespaces (SI-7).
            Conflict: a version number reused for a different definition.

        ``refuse``, called once the definitions are valid, may raise to refuse
        them (the policy rules in force must still type-check).
        """
        if not definitions:
            raise InvalidRequest("no capabilities to register")
        problems = [p for d in definitions for p in check_definition(d)]
        ids = [d.id for d in definitions]
        problems += [f"{i}: listed twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
        if problems:
            raise InvalidRequest("invalid capability definitions:\n  " + "\n  ".join(problems))
        foreign = [d.id for d in definitions if not service.owns(d.id)]
        if foreign:
            refusal = (
                f"service {service.name!r} does not own the namespace of {', '.join(foreign)} "
                f"(it owns: {', '.join(service.namespaces)})"
            )
            # An attempt on another service's namespace is on the record (SI-7).
            event = AuditEvent(
                kind="registry",
                status="refused",
                capability_id=foreign[0],
                service=service.name,
                reason=refusal[:1000],
            )
            self._store.transact(lambda tx: tx.append_audit(event))
            raise PermissionDenied(refusal)
        if refuse is not None:
            refuse(definitions)

        def work(tx: WriteTransaction) -> list[CapabilityRecord]:
            records = [self._register_one(tx, service, d) for d in definitions]
            self._check_quota(tx, service)
            return records

        records = self._store.transact(work)
        return [self._capability(r) for r in records]

    def _check_quota(self, tx: WriteTransaction, service: Service) -> None:
        """Refuse (undoing the transaction) a registry beyond the service's share."""
        count, size = tx.registry_size(service.namespaces)
        limits = self._limits
        if count > limits.max_capabilities_per_service:
            raise ResourceExhausted(
                f"service {service.name!r} would have {count} capabilities; at most "
                f"{limits.max_capabilities_per_service} ([limits] max_capabilities_per_service)"
            )
        if size > limits.max_registry_bytes_per_service:
            raise ResourceExhausted(
                f"service {service.name!r} would have {size} bytes of capability definitions; "
                f"at most {limits.max_registry_bytes_per_service} "
                "([limits] max_registry_bytes_per_service)"
            )

    def _register_one(
        self, tx: WriteTransaction, service: Service, definition: CapabilityDefinition
    ) -> CapabilityRecord:
        content = definition.content_digest()
        versions = tx.capability_versions(definition.id)
        if definition.version:
            same = next((v for v in versions if v.version == definition.version), None)
            if same is not None:
                if same.digest != content:
                    raise Conflict(
                        f"{definition.id} version {definition.version} is already registered "
                        "with a different definition; a changed definition needs a new version"
                    )
                return same
            version = definition.version
        else:
            if versions and versions[-1].digest == content:
                return versions[-1]
            version = _next_version(versions)
        stored = CapabilityDefinition.from_json({**definition.to_json(), "version": version})
        record = CapabilityRecord(
            id=definition.id,
            version=version,
            service=service.name,
            digest=content,
            definition=stored.to_json(),
            registered_at=now_iso(),
        )
        tx.insert_capability(record)
        tx.append_audit(
            AuditEvent(
                kind="registry",
                status="registered",
                capability_id=definition.id,
                capability_version=version,
                service=service.name,
                input_digest=content,
                details=compact_json(
                    {"side_effect": definition.side_effect, "exposure": list(definition.exposure)}
                ),
            )
        )
        return record

    def get(self, capability_id: str, version: str = "") -> Capability | None:
        """A version, or the latest when ``version`` is empty."""
        if not version:
            # Which version is latest is asked of the store every time (another
            # plane may have registered one); the definition, once known, is not.
            version = self._store.latest_version(capability_id) or ""
            if not version:
                return None
        if cached := self._cache.get((capability_id, version)):
            return cached
        record = self._store.get_capability(capability_id, version)
        return self._capability(record) if record else None

    def declared_codes(self, capability_id: str, version: str) -> frozenset[str]:
        """The error codes a capability version declares (none for an unknown one)."""
        capability = self.get(capability_id, version) if version else None
        if capability is None:
            return frozenset()
        return frozenset(e.code for e in capability.definition.errors)

    def latest(self, namespaces: Sequence[str] | None = None) -> list[Capability]:
        """The newest version of every capability, or of those in ``namespaces``
        (read through an index: the cost follows those namespaces alone)."""
        return [self._capability(r) for r in self._store.latest_capabilities(namespaces)]

    def every_version(self) -> list[Capability]:
        """Every registered version of every capability, oldest first per id: a
        pinned older version can still be called, so the rules must hold for it.
        A version whose row fails its integrity check is left out (and reported):
        it is never served either."""
        return [self._capability(record) for record in self._store.every_capability_version()]

    def versions_read(self) -> int:
        """How many capability versions this plane has read from the store."""
        with self._lock:
            return len(self._cache)

    def _capability(self, record: CapabilityRecord) -> Capability:
        key = (record.id, record.version)
        with self._lock:
            cached = self._cache.get(key)
            if cached is None:
                definition = CapabilityDefinition.from_json(record.definition)
                cached = Capability(
                    definition=definition,
                    service=record.service,
                    digest=record.digest,
                    registered_at=record.registered_at,
                    sensitive_input=marks_anything(definition.input_schema, SENSITIVE),
                    sensitive_output=marks_anything(definition.output_schema, SENSITIVE),
                )
                self._cache[key] = cached
        return cached


def _next_version(versions: list[CapabilityRecord]) -> str:
    numbers = [int(v.version) for v in versions if v.version.isdigit()]
    return str(max(numbers, default=0) + 1)


def schema_from_json(text: str, what: str, max_bytes: int) -> dict[str, Any]:
    """Parse a schema sent as JSON text.

    Raises:
        InvalidRequest: larger than ``max_bytes``, not JSON, beyond the JSON
            limits (``strict_loads``), or not an object.
    """
    if len(text) > max_bytes or len(text.encode()) > max_bytes:
        raise InvalidRequest(f"{what} is larger than {max_bytes} bytes")
    try:
        value = strict_loads(text) if text else {}
    except JSONLimitError as exc:
        raise InvalidRequest(f"{what} {exc}") from None
    except ValueError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    return value
