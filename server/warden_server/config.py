"""Typed configuration: one model per section of ``warden.toml``.

Secrets come from the file or from the environment (``WARDEN_ACTORS_HS256_SECRET``,
``WARDEN_SERVICE_<NAME>_TOKEN``, ``WARDEN_REDACTION_HASH_KEY``,
``WARDEN_IDEMPOTENCY_REPLAY_KEY``), never from code. ``load_config`` takes the
environment as an argument so that tests never patch ``os.environ``.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import tomllib
import typing
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from warden_server import tomlpos
from warden_server.placement import usable_cpus
from warden_server.policy.model import MAX_TTL_DAYS, parse_duration

_NAMESPACE = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$"


class ConfigError(Exception):
    """The configuration cannot be used; the message names every problem."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


STORE_SCHEMES: Final = ("postgresql", "postgres")
URL_SCHEME: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")
"""A store that starts with a scheme is a URL, whatever the scheme, never a path."""
"""URL schemes of a PostgreSQL store."""
POSTGRES_FILES: Final = "var/warden"


class ServerSection(_Section):
    listen: str = "127.0.0.1:50051"
    """host:port the gRPC server binds; port 0 picks a free port."""
    tls_cert_file: str | None = None
    """PEM certificate chain: with ``tls_key_file``, the plane serves TLS only."""
    tls_key_file: str | None = None
    """The private key of ``tls_cert_file``."""
    tls_client_ca_file: str | None = None
    """PEM CA certificates: clients must present a certificate they signed (mutual TLS)."""
    store: str = "var/warden.db"
    """The audit and registry store: a SQLite file path, or a PostgreSQL
    connection URL (``postgresql://user@host/db``) that replicas of the plane
    share. The password comes from libpq's environment (``PGPASSWORD``), a
    ``.pgpass`` file or a service file, never from this file."""
    policies: str = "policies"
    """The folder of policy files."""
    default_effect: Literal["allow", "deny"] = "deny"
    """The decision when no rule matches. Deny fails closed."""
    evaluator: Literal["cel-cpp", "cel-python"] = "cel-cpp"
    """The CEL runtime that evaluates policies. ``cel-cpp`` (Google's C++ CEL)
    serves a policy set only when it agrees with ``cel-python``, the reference,
    on every test case of the folder's ``tests/``; otherwise the reference
    serves it and the log says why."""
    watch_policies: bool = True
    """Reload the policy folder when its files change; a set with problems
    never replaces the one in force (SI-12)."""
    policy_debounce_ms: Annotated[int, Field(ge=10, le=60_000)] = 300
    """How long changes to the policy folder are gathered before one reload,
    so that a multi-file edit is read once, whole."""
    max_input_bytes: Annotated[int, Field(gt=0)] = 1_048_576
    """Larger inputs fail INPUT_INVALID before they are parsed."""
    default_timeout_ms: Annotated[int, Field(gt=0)] = 30_000
    """A handler's time budget when its capability declares none."""
    approval_ttl: str = "1h"
    """How long an approval request stays open when its rule gives no ttl."""
    workers: Annotated[int, Field(gt=0)] = 16
    """Threads serving the blocking RPCs, in each process: every method but
    ``Begin``, which runs on the server's event loop."""
    processes: Annotated[int, Field(gt=0, le=256)] | None = None
    """Processes serving the port together (SO_REUSEPORT), each with its own
    policy set and store connection; the audit chain stays one (appends are
    serialized by the store's write lock, group-committed per process).
    Default: one per CPU this process may run on."""
    pin_processes: bool = True
    """With one process per CPU (the default count), run each process on a CPU
    of its own (Linux): its threads (the event loop, gRPC's poller, the pool)
    hand the interpreter to each other on one core, in that core's caches.
    Turn it off when the plane shares its CPUs with other busy work, so that
    the kernel may move its processes to idle ones."""
    request_deadline_ms: Annotated[int, Field(gt=0)] = 5_000
    """The plane's own time budget per request (shortened by the caller's gRPC
    deadline). A Begin that runs out of time fails closed and never commits a grant."""
    approval_sweep_seconds: Annotated[float, Field(gt=0)] = 15.0
    """How often the plane marks approvals whose time is up as expired (and tells
    watchers). Expiry is enforced at every use regardless; this keeps states honest."""
    replica_report_seconds: Annotated[float, Field(gt=0)] = 10.0
    """How often the plane reports what it serves (its policy revision, refused
    change, registrations) to the other replicas on its store; one that misses
    three reports is no longer shown as live."""
    max_approval_watchers: Annotated[int, Field(ge=0)] = 4
    """Open approval watch streams at most. Each holds a thread of its own
    for as long as it is open (not one of the ``workers``)."""

    @field_validator("approval_ttl")
    @classmethod
    def _ttl_is_duration(cls, value: str) -> str:
        if parse_duration(value, longest_days=MAX_TTL_DAYS) <= 0:
            raise ValueError(f"{value!r}: an approval request open for no time expires at once")
        return value

    @model_validator(mode="after")
    def _store_is_supported(self) -> ServerSection:
        # Any other "scheme:..." would be taken as a relative path: a
        # "mysql:" folder beside the config, quietly shared by replicas.
        scheme = URL_SCHEME.match(self.store)
        if scheme is None:
            return self
        if scheme.group(1) not in STORE_SCHEMES:
            raise ValueError(
                f"store {self.store!r} names a {scheme.group(1)!r} URL; a store is a SQLite "
                'file path (e.g. store = "var/warden.db") or a postgresql:// URL'
            )
        if re.match(r"^[a-z]+://[^/@]*:[^/@]*@", self.store) or "password=" in self.store:
            raise ValueError(
                "the store URL holds a password: give it through the environment "
                "(PGPASSWORD), a .pgpass file or a service file, not the config"
            )
        return self

    @model_validator(mode="after")
    def _tls_files_together(self) -> ServerSection:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("set tls_cert_file and tls_key_file together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file")
        return self


MIN_HS256_SECRET_BYTES: Final = 32


class ActorsSection(_Section):
    hs256_secret: str | None = None
    """Shared secret for HS256 actor JWTs: development only."""
    public_key_file: str | None = None
    """PEM public key for RS256 or ES256 actor JWTs."""
    jwks_file: str | None = None
    """A JWKS document with the keys for RS256/ES256 actor JWTs, chosen by kid."""
    issuer: str = "warden-dev"
    """Required ``iss`` claim."""
    audience: str = "warden"
    """Required ``aud`` claim."""
    leeway_seconds: Annotated[int, Field(ge=0)] = 30
    """Clock skew tolerated on ``exp``/``nbf``."""

    @field_validator("hs256_secret")
    @classmethod
    def _secret_long_enough(cls, value: str | None) -> str | None:
        if value and len(value.encode()) < MIN_HS256_SECRET_BYTES:
            raise ValueError(
                f"the secret is {len(value.encode())} bytes; an HS256 secret needs at least "
                f"{MIN_HS256_SECRET_BYTES} (256 bits, RFC 7518 3.2), or it can be guessed "
                "from a single token"
            )
        return value

    @model_validator(mode="after")
    def _one_key_source(self) -> ActorsSection:
        sources = [s for s in (self.hs256_secret, self.public_key_file, self.jwks_file) if s]
        if len(sources) != 1:
            raise ValueError(
                "set exactly one of hs256_secret, public_key_file or jwks_file "
                "(or WARDEN_ACTORS_HS256_SECRET in the environment)"
            )
        return self


class ServiceSection(_Section):
    token: str | None = None
    """The service's bearer token (or set WARDEN_SERVICE_<NAME>_TOKEN)."""
    token_sha256: str | None = None
    """The SHA-256 hex digest of the token, so the file holds no secret."""
    namespaces: list[Annotated[str, Field(pattern=_NAMESPACE)]] = Field(min_length=1)
    """Capability namespaces this service owns (SI-7): "orders" owns orders.*."""

    @model_validator(mode="after")
    def _one_credential(self) -> ServiceSection:
        if bool(self.token) == bool(self.token_sha256):
            raise ValueError(
                "set exactly one of token or token_sha256 (or give the token in the "
                "environment as WARDEN_SERVICE_<NAME>_TOKEN, NAME this section's name in "
                "capitals, '-' as '_')"
            )
        if self.token_sha256 and not re.fullmatch(r"[0-9a-f]{64}", self.token_sha256):
            raise ValueError("token_sha256 must be 64 lowercase hex digits")
        return self

    @property
    def token_digest(self) -> str:
        if self.token_sha256:
            return self.token_sha256
        assert self.token is not None
        return hashlib.sha256(self.token.encode()).hexdigest()


class GrantsSection(_Section):
    signing_key_file: str | None = None
    """PEM Ed25519 private key that signs grants. When unset, the plane makes one
    once beside the store (``<store>.grant-key``, mode 0600) and reuses it at
    every start, so grants, and the outcomes reported with them, outlive a restart."""
    ttl_seconds: Annotated[int, Field(gt=0)] = 60
    """How long a grant stays valid beyond its handler's time budget."""
    verification_key_files: list[str] = []
    """Ed25519 keys (PEM, public or private) published and accepted beside the
    signing key but never signing: the next key before a rotation, the previous
    one until its grants have expired."""


class IdempotencySection(_Section):
    window: str = "24h"
    """How long a key is remembered (a duration: 90s, 30m, 24h, 7d). Make it
    longer than any handler's time budget."""
    replay_key: str | None = Field(default=None, repr=False)
    """Seals recorded outputs for replay (or WARDEN_IDEMPOTENCY_REPLAY_KEY),
    at least 16 characters. When unset, the plane makes a key once and keeps
    it beside the store (``<store>.replay-key``, 0600)."""

    @model_validator(mode="after")
    def _valid(self) -> IdempotencySection:
        if parse_duration(self.window) <= 0:
            raise ValueError("window must be longer than zero")
        if self.replay_key is not None and len(self.replay_key) < 16:
            raise ValueError("replay_key must be at least 16 characters")
        return self

    @property
    def window_seconds(self) -> int:
        return parse_duration(self.window)


class RedactionSection(_Section):
    mode: Literal["mask", "keyed-hash"] = "mask"
    """How sensitive values are stored (SI-5): "mask" writes [REDACTED];
    "keyed-hash" writes hmac-sha256:<hex> under hash_key, so equal values can be
    correlated without being revealed."""
    hash_key: str | None = Field(default=None, repr=False)
    """The HMAC key for keyed-hash (or WARDEN_REDACTION_HASH_KEY), at least 16 characters."""

    @model_validator(mode="after")
    def _key_for_hashing(self) -> RedactionSection:
        if self.mode == "keyed-hash" and (self.hash_key is None or len(self.hash_key) < 16):
            raise ValueError(
                "mode keyed-hash needs hash_key of at least 16 characters "
                "(or WARDEN_REDACTION_HASH_KEY in the environment)"
            )
        return self


class AuditSection(_Section):
    retention: str | None = None
    """Prune records older than this (``90d``); unset keeps everything."""
    prune_interval: str = "1h"
    """How often the plane prunes when ``retention`` is set."""
    checkpoint_key_file: str | None = None
    """PEM Ed25519 key that signs retention checkpoints (the private key where
    pruning runs; the public key is enough to verify). Required with ``retention``."""
    read_rate: Annotated[float, Field(gt=0)] = 5.0
    """Audit API reads (Query, Stats, Verify, Export) each caller may make per
    second on average, in each plane process; past it a read is refused
    RESOURCE_EXHAUSTED with ``retry-after-ms``."""
    read_burst: Annotated[int, Field(ge=1)] = 20
    """Audit API reads a caller may make at once before ``read_rate`` applies."""
    anchor_interval: str | None = "1h"
    """How often the plane appends the chain's head to ``anchor_file`` (when it
    moved), signed with the checkpoint key when it holds the private half; set
    to "" to publish none. Ship the file off the machine: ``verify --anchors``."""
    anchor_file: str | None = None
    """Where anchors are published: by default beside the store (``<store>.anchors``)."""

    @model_validator(mode="after")
    def _durations(self) -> AuditSection:
        for name in ("retention", "prune_interval", "anchor_interval"):
            value = getattr(self, name)
            if value:
                try:
                    parse_duration(value)
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from None
        if self.retention and not self.checkpoint_key_file:
            raise ValueError("retention needs checkpoint_key_file to sign its checkpoints")
        return self


class LimitsSection(_Section):
    """What one request may ask of the plane, so that none holds it past its
    budget. Beyond these, JSON in any field nests at most 64 levels deep and
    its integers have at most 32 digits (``warden.shared.canonical``);
    ``[server] max_input_bytes`` bounds a call's input."""

    max_context_bytes: Annotated[int, Field(gt=0)] = 65_536
    """The largest ``context_json`` (Begin, ListCapabilities, GetCapability)
    and ``failure.details_json`` (Complete), in bytes."""
    max_capabilities_per_register: Annotated[int, Field(gt=0)] = 100
    """Capabilities one Register call may carry."""
    max_capabilities_per_service: Annotated[int, Field(gt=0)] = 500
    """Capabilities a service may have registered in its namespaces (counting
    each id once, whatever its versions)."""
    max_schema_bytes: Annotated[int, Field(gt=0)] = 65_536
    """The largest input or output schema, as JSON text, in bytes."""
    max_registry_bytes_per_service: Annotated[int, Field(gt=0)] = 2_097_152
    """The latest definitions of a service's capabilities together, as JSON, in
    bytes: what discovery answers at most, so that its answer fits one message."""


class PoliciesSection(_Section):
    require_passing_tests: bool = True
    """A policy set whose own tests (``tests/`` of the policy folder) fail, or
    whose test files have problems, is not loaded: at startup the plane does
    not start, on reload the set in force stays (SI-12)."""


class TelemetrySection(_Section):
    metrics_listen: str | None = None
    """host:port of the Prometheus endpoint (``/metrics``), an IPv6 host in
    brackets (``[::1]:9464``); unset (or ``"off"``, as ``--metrics-listen off``
    says it) serves none."""

    traces: Literal["none", "console", "otlp"] = "none"
    """Where finished spans go: ``otlp`` sends them to an OpenTelemetry
    collector over OTLP/HTTP. Trace ids reach the audit records either way."""
    otlp_endpoint: str | None = None
    """The collector's traces URL (``http://collector:4318/v1/traces``); unset
    reads ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
    metrics: Literal["none", "otlp"] = "none"
    """``otlp`` also pushes the figures ``/metrics`` serves to an OpenTelemetry
    collector over OTLP/HTTP, every ``otlp_metrics_interval`` and at shutdown."""
    otlp_metrics_endpoint: str | None = None
    """The collector's metrics URL (``http://collector:4318/v1/metrics``); unset
    reads ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
    otlp_metrics_interval: str = "60s"
    """How often the metrics are pushed (a duration: 10s, 1m)."""
    otlp_headers: dict[str, str] = {}
    """Headers for the collector, traces and metrics alike (an API key); empty
    reads ``OTEL_EXPORTER_OTLP_HEADERS``."""
    log_format: Literal["text", "json"] = "text"
    """``json``: one object per line, for log shippers."""

    @model_validator(mode="after")
    def _interval(self) -> TelemetrySection:
        try:
            seconds = parse_duration(self.otlp_metrics_interval)
        except ValueError as exc:
            raise ValueError(f"otlp_metrics_interval: {exc}") from None
        if seconds <= 0:
            raise ValueError("otlp_metrics_interval: must be longer than 0s")
        return self

    @field_validator("metrics_listen")
    @classmethod
    def _metrics_off(cls, value: str | None) -> str | None:
        return None if value is not None and value.strip() in ("", "off") else value


class ConsoleSection(_Section):
    """The web console (``warden console``): a browser front end that reaches
    the plane only through its gRPC APIs, with each person's own token."""

    listen: str = "127.0.0.1:8080"
    """host:port the console serves HTTP (or HTTPS, with ``tls_cert_file``) on."""
    target: str | None = None
    """The plane's host:port; unset means ``[server] listen``."""
    token_header: str | None = None
    """A request header carrying the person's actor JWT, set by an
    authenticating reverse proxy (e.g. ``X-Forwarded-Access-Token`` from
    oauth2-proxy); unset, people sign in by pasting a token."""
    session_ttl: str = "8h"
    """How long a sign-in lasts at most (never past the token's own expiry)."""
    public_url: str | None = None
    """The console's address as people reach it (``https://warden.example``),
    for links in notifications; unset means ``http://`` + ``listen``."""
    tls_cert_file: str | None = None
    """PEM certificate chain: with ``tls_key_file``, the console serves HTTPS
    and its session cookie is ``Secure``."""
    tls_key_file: str | None = None
    """The private key of ``tls_cert_file``."""

    @model_validator(mode="after")
    def _valid(self) -> ConsoleSection:
        try:
            parse_duration(self.session_ttl)
        except ValueError as exc:
            raise ValueError(f"session_ttl: {exc}") from None
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self


class WebhookSection(_Section):
    url: str
    """Where notifications are POSTed (http or https)."""
    secret: str = Field(repr=False, min_length=16)
    """The HMAC-SHA256 key of the ``X-Warden-Signature`` header, at least 16
    characters (or WARDEN_NOTIFICATIONS_SECRET_<N>, N counting from 0)."""
    format: Literal["warden", "slack"] = "warden"
    """``warden``: the event as JSON; ``slack``: a Slack-compatible message
    (``text`` and ``blocks``) for an incoming webhook."""
    events: list[Literal["requested", "approved", "denied", "expired"]] = [
        "requested",
        "approved",
        "denied",
        "expired",
    ]
    """The approval events sent to this webhook."""

    @model_validator(mode="after")
    def _http(self) -> WebhookSection:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} is not an http:// or https:// address")
        return self


class NotificationsSection(_Section):
    """Approval notifications: a webhook POST per approval event, retried with
    backoff from a durable queue in the store."""

    webhooks: list[WebhookSection] = []
    console_url: str | None = None
    """The console's address for the link in each notification; unset means
    ``[console] public_url``, else ``http://`` + ``[console] listen``."""
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 12
    """Attempts per notification before it is given up (and logged)."""
    retry_initial_seconds: Annotated[float, Field(gt=0)] = 1.0
    """The wait after the first failed attempt; it doubles after each."""
    retry_max_seconds: Annotated[float, Field(gt=0)] = 600.0
    """The longest wait between attempts."""
    poll_seconds: Annotated[float, Field(gt=0)] = 1.0
    """How often new approval records are looked for."""


class Config(_Section):
    server: ServerSection = ServerSection()
    actors: ActorsSection
    services: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]*$")], ServiceSection] = {}
    grants: GrantsSection = GrantsSection()
    idempotency: IdempotencySection = IdempotencySection()
    redaction: RedactionSection = RedactionSection()
    audit: AuditSection = AuditSection()
    telemetry: TelemetrySection = TelemetrySection()
    limits: LimitsSection = LimitsSection()
    policies: PoliciesSection = PoliciesSection()
    console: ConsoleSection = ConsoleSection()
    notifications: NotificationsSection = NotificationsSection()
    base_dir: Path = Path()
    """The folder relative paths are resolved against (the config file's)."""

    @model_validator(mode="after")
    def _disjoint_namespaces(self) -> Config:
        owners: dict[str, str] = {}
        for name, service in self.services.items():
            for namespace in service.namespaces:
                for other, owner in owners.items():
                    if owner != name and (
                        namespace == other
                        or namespace.startswith(other + ".")
                        or other.startswith(namespace + ".")
                    ):
                        raise ValueError(
                            f"namespace {namespace!r} of service {name!r} overlaps "
                            f"{other!r} of service {owner!r}"
                        )
                owners[namespace] = name
        return self

    @model_validator(mode="after")
    def _notifications_on_sqlite(self) -> Config:
        # The delivery queue lives in the SQLite store file beside the log it follows.
        if self.notifications.webhooks and self.store_url is not None:
            raise ValueError(
                "[notifications] webhooks need the SQLite store for now; with a PostgreSQL "
                "store, follow approval records with `warden audit tail --follow --kind approval`"
            )
        return self

    def path(self, value: str) -> Path:
        """A configured path, resolved against the config file's folder."""
        candidate = Path(value)
        return candidate if candidate.is_absolute() else self.base_dir / candidate

    @property
    def process_count(self) -> int:
        """``[server] processes``, or the number of CPUs this process may run on
        when unset (a container's CPU set, not the whole machine's)."""
        return self.server.processes or len(usable_cpus()) or 1

    @property
    def store_url(self) -> str | None:
        """The PostgreSQL URL of a replicated store; None for a SQLite file."""
        store = self.server.store
        return store if store.split(":", 1)[0] in STORE_SCHEMES else None

    @property
    def store_path(self) -> Path:
        """The SQLite store file; for a PostgreSQL store, the base name of the
        files kept beside it on every replica (``var/warden``: its grant key,
        integrity key and anchors)."""
        return self.path(POSTGRES_FILES if self.store_url else self.server.store)

    @property
    def policies_path(self) -> Path:
        return self.path(self.server.policies)

    @property
    def anchors_path(self) -> Path:
        """Where the plane publishes its anchors (``[audit] anchor_file``)."""
        configured = self.audit.anchor_file
        store = self.store_path
        return self.path(configured) if configured else store.with_name(store.name + ".anchors")


def load_config(
    path: str | Path,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, str | None] | None = None,
) -> Config:
    """Read ``warden.toml``, apply environment secrets and command-line overrides.

    Args:
        path: The TOML file.
        environ: The environment to read secrets from (``os.environ`` in the CLI).
        overrides: ``[server]`` keys given on the command line; None values are ignored.

    Raises:
        ConfigError: unreadable file, bad TOML, or invalid values (all listed).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(_toml_problem(str(path), exc)) from None
    return config_from_dict(
        data,
        base_dir=path.parent,
        environ=environ or {},
        overrides=overrides,
        source=str(path),
        lines=tomlpos.key_lines(text),
    )


KEY_FILES: Final[tuple[tuple[str, str], ...]] = (
    ("server", "tls_cert_file"),
    ("server", "tls_key_file"),
    ("server", "tls_client_ca_file"),
    ("actors", "public_key_file"),
    ("actors", "jwks_file"),
    ("grants", "signing_key_file"),
    ("grants", "verification_key_files"),
    ("audit", "checkpoint_key_file"),
)
"""The settings that name files the plane reads as it starts."""

ED25519_KEY_FILES: Final[dict[tuple[str, str], bool]] = {
    ("grants", "signing_key_file"): True,
    ("grants", "verification_key_files"): False,
    ("audit", "checkpoint_key_file"): False,
}
"""The settings that name Ed25519 keys, and whether the key must be private."""


def check_files(
    path: str | Path, config: Config, *, from_command_line: Collection[str] = ()
) -> None:
    """Every file a plane started with ``config`` (read from ``path``) would
    read, and its policy folder, checked at once before it makes anything:
    each one missing is a problem at its line (``from_command_line``: the
    ``[server]`` keys the command line gave instead).

    Raises:
        ConfigError: files named in the config are missing (all listed).
    """
    try:
        lines = tomlpos.key_lines(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        lines = {}
    problems = []
    for section, key in KEY_FILES:
        value = getattr(getattr(config, section), key)
        for index, name in enumerate(value if isinstance(value, list) else [value]):
            if name is None:
                continue
            file = config.path(name)
            if not file.exists():
                problem = f"no such file {file}"
            elif (section, key) in ED25519_KEY_FILES:
                problem = _ed25519_problem(file, private=ED25519_KEY_FILES[section, key]) or ""
            elif section == "server" and key.startswith("tls_"):
                problem = _tls_problem(key, file, config) or ""
            else:
                continue
            if not problem:
                continue
            setting: tomlpos.Path = (
                (section, key, index) if isinstance(value, list) else (section, key)
            )
            line = tomlpos.line_of(lines, setting)
            where = f"{path}:{line}: " if line is not None else ""
            shown = f"{section}.{key}" + (f"[{index}]" if isinstance(value, list) else "")
            problems.append(f"  {where}{shown}: {problem}")
    if not config.policies_path.is_dir():
        if "policies" in from_command_line:
            where, origin = "", " (from the command line)"
        else:
            line = tomlpos.line_of(lines, ("server", "policies"))
            where, origin = (f"{path}:{line}: " if line is not None else ""), ""
        problems.append(f"  {where}server.policies: no such folder {config.policies_path}{origin}")
    if problems:
        raise ConfigError(
            f"{path}: files it names are missing or unusable:\n" + "\n".join(problems)
        )


def _tls_problem(key: str, file: Path, config: Config) -> str | None:
    """What keeps ``file`` from being the TLS certificate chain, private key or
    client CA its setting names, if anything: gRPC itself would say only that
    it could not bind the port."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        pem = file.read_bytes()
    except OSError as exc:
        return f"cannot read {file}: {exc.strerror or exc}"
    if key in ("tls_cert_file", "tls_client_ca_file"):
        try:
            x509.load_pem_x509_certificates(pem)
        except ValueError:
            return f"{file} holds no PEM certificate"
        return None
    try:
        private = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        return f"{file} is not a PEM private key without a password"
    cert_file = config.server.tls_cert_file
    if cert_file is None:
        return None
    try:
        leaf = x509.load_pem_x509_certificates(config.path(cert_file).read_bytes())[0]
    except (OSError, ValueError):
        return None  # the certificate's own problem is named at its line
    ours = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    if private.public_key().public_bytes(encoding, ours) != leaf.public_key().public_bytes(
        encoding, ours
    ):
        return f"{file} is not the private key of the certificate in {config.path(cert_file)}"
    return None


def _ed25519_problem(file: Path, *, private: bool) -> str | None:
    """What keeps ``file`` from being the Ed25519 key a setting needs, if anything."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    try:
        pem = file.read_bytes()
    except OSError as exc:
        return f"cannot read {file}: {exc.strerror or exc}"
    key: object
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        try:
            key = serialization.load_pem_public_key(pem)
        except ValueError:
            return f"{file} is not a PEM key without a password"
    if not isinstance(key, Ed25519PrivateKey | Ed25519PublicKey):
        name = type(key).__name__
        visibility = "private" if "Private" in name else "public"
        algorithm = name.replace("PrivateKey", "").replace("PublicKey", "")
        return f"{file} holds a {visibility} {algorithm} key; it must be Ed25519"
    if private and not isinstance(key, Ed25519PrivateKey):
        return f"{file} is a public key; grants are signed with the private one"
    return None


def _toml_problem(source: str, exc: tomllib.TOMLDecodeError) -> str:
    """``file:line:column: what`` from tomllib's "what (at line L, column C)"."""
    found = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", str(exc), re.DOTALL)
    if found is None:
        return f"{source}: {exc}"
    what, line, column = found.groups()
    return f"{source}:{line}:{column}: {what}"


def config_from_dict(
    data: Mapping[str, object],
    *,
    base_dir: Path = Path(),
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, str | None] | None = None,
    source: str = "<config>",
    lines: Mapping[tomlpos.Path, int] | None = None,
) -> Config:
    """Build a Config from already-parsed TOML data (see ``load_config``);
    ``lines`` (``tomlpos.key_lines``) puts the line of each problem in its message."""
    environ = environ or {}
    given: dict[tomlpos.Path, str] = {}
    """Values that do not come from the file, and where they come from instead."""
    merged: dict[str, object] = {k: v for k, v in data.items()}
    server = dict(_table(merged.get("server")))
    for key, value in (overrides or {}).items():
        if value is not None:
            server[key] = value
            given[("server", key)] = "the command line"
    merged["server"] = server
    actors = dict(_table(merged.get("actors")))
    if secret := environ.get("WARDEN_ACTORS_HS256_SECRET"):
        actors["hs256_secret"] = secret
        given[("actors", "hs256_secret")] = "WARDEN_ACTORS_HS256_SECRET"
    merged["actors"] = actors
    services = {
        name: dict(_table(section)) for name, section in _table(merged.get("services")).items()
    }
    for name, section in services.items():
        env_key = f"WARDEN_SERVICE_{name.upper().replace('-', '_')}_TOKEN"
        if token := environ.get(env_key):
            section["token"] = token
            section.pop("token_sha256", None)
            given[("services", name, "token")] = env_key
    merged["services"] = services
    for table, key, env_key in (
        ("redaction", "hash_key", "WARDEN_REDACTION_HASH_KEY"),
        ("idempotency", "replay_key", "WARDEN_IDEMPOTENCY_REPLAY_KEY"),
    ):
        if secret := environ.get(env_key):
            merged[table] = {**_table(merged.get(table)), key: secret}
            given[(table, key)] = env_key
    notifications = dict(_table(merged.get("notifications")))
    hooks = notifications.get("webhooks")
    if isinstance(hooks, list):
        hooks = list(hooks)
        for i, hook in enumerate(hooks):
            env_key = f"WARDEN_NOTIFICATIONS_SECRET_{i}"
            if env_key in environ:
                hooks[i] = {**_table(hook), "secret": environ[env_key]}
                given[("notifications", "webhooks", i, "secret")] = env_key
        notifications["webhooks"] = hooks
        merged["notifications"] = notifications
    merged["base_dir"] = base_dir
    try:
        return Config.model_validate(merged)
    except ValidationError as exc:
        problems = "\n".join(
            "  " + _problem(error, source, lines or {}, given) for error in exc.errors()
        )
        raise ConfigError(f"{source}: invalid configuration:\n{problems}") from None


def _problem(
    error: ErrorDetails,
    source: str,
    lines: Mapping[tomlpos.Path, int],
    given: Mapping[tomlpos.Path, str],
) -> str:
    """One problem: where it is written (``file:line``), which setting, what is wrong."""
    loc = tuple(error["loc"])
    setting = ".".join(str(part) for part in loc) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown setting" + did_you_mean(Config, loc)
    # A section's own check that names one of its keys is about that key.
    named = next(
        (
            path
            for path in (*given, *lines)
            if len(path) == len(loc) + 1
            and path[:-1] == loc
            and re.search(rf"\b{re.escape(str(path[-1]))}\b", message)
        ),
        loc,
    )
    origin = next(
        (given[named[:end]] for end in range(len(named), 0, -1) if named[:end] in given), None
    )
    if origin is not None:
        return f"{setting}: {message} (from {origin})"
    line = tomlpos.line_of(lines, named)
    where = f"{source}:{line}: " if line is not None else ""
    return f"{where}{setting}: {message}"


def did_you_mean(model: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    """`` (did you mean 'x'?)`` for a mistyped key at ``loc`` in ``model``
    (this config, a policy file, a policy test file), or "" when no key of
    the model found there is close."""
    kind: object = model
    for part in loc[:-1]:
        while typing.get_origin(kind) is typing.Annotated:
            kind = typing.get_args(kind)[0]
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            field = kind.model_fields.get(str(part))
            kind = field.annotation if field is not None else None
        elif typing.get_origin(kind) in (dict, list):
            kind = typing.get_args(kind)[-1]  # a service's name, a rule's index
        else:
            return ""
    while typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    if not (isinstance(kind, type) and issubclass(kind, BaseModel)):
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(kind.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _table(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}
