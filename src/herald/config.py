"""Configuration: a TOML file, overridden by ``HERALD_…`` environment variables.

Every key is documented in ``config.example.toml``. Loading never half-works:
an invalid file or value raises :class:`~herald.errors.ConfigError` with one
message that names each offending key.
"""

from __future__ import annotations

import base64
import difflib
import functools
import ipaddress
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import SplitResult, unquote, unquote_plus, urlsplit

import pydantic
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from herald.crypto import parse_key
from herald.errors import ConfigError
from herald.flow import BreakerSettings

ENV_PREFIX = "HERALD_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _every(parse: Callable[[str], object], what: str) -> AfterValidator:
    """One check of the whole tuple, not one per item: per item, pydantic would add the
    item's index to the key the message names."""

    def check(values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            try:
                parse(value)
            except ValueError as exc:
                raise ValueError(f"{value!r} is not {what}") from exc
        return values

    return AfterValidator(check)


def _check_key(key: SecretStr, *, where: str = "") -> SecretStr:
    try:
        parse_key(key.get_secret_value())
    except ConfigError as exc:
        raise ValueError(f"{where}{exc.message}") from None
    return key


def _check_proxy(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected http://host:port or https://host:port")
    return value


_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _check_origin(value: str) -> str:
    """An origin a CSP ``frame-ancestors`` can name: ``scheme://host[:port]`` and
    nothing more (no path, no user, no wildcard, nothing that would break the header)."""
    parts = urlsplit(value)
    port = parts.port  # a bad port raises ValueError
    host = parts.hostname or ""
    if (
        parts.scheme not in ("http", "https")
        or value != f"{parts.scheme}://{parts.netloc}"
        or "@" in parts.netloc
        or port == 0
    ):
        raise ValueError("expected scheme://host[:port]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not all(_HOST_LABEL.fullmatch(label) for label in host.split(".")):
            raise ValueError("expected scheme://host[:port]") from None
    return value


LOGO_DATA = re.compile(r"data:image/(png|gif|jpeg|webp|svg\+xml);base64,[A-Za-z0-9+/]+={0,2}")
MAX_LOGO_CHARS = 65_536
_ACCENT = re.compile(r"#[0-9a-fA-F]{3}(?:[0-9a-fA-F]{3})?")


def _check_logo(value: str) -> str:
    """A same-origin path or an image ``data:`` URL: what the portal's CSP
    (``img-src 'self' data:``) lets a page load, and nothing that breaks out of it."""
    if len(value) > MAX_LOGO_CHARS:
        raise ValueError(f"must be at most {MAX_LOGO_CHARS} characters")
    same_origin = (
        value.startswith("/")
        and not value.startswith("//")
        and "\\" not in value
        and value.isprintable()
        and " " not in value
    )
    if not same_origin and not LOGO_DATA.fullmatch(value):
        raise ValueError(
            "must be a path on Herald's own origin (/brand/logo.svg) or a"
            " data:image/png|gif|jpeg|webp|svg+xml;base64,… URL; another site's"
            " image is refused by the portal's Content-Security-Policy"
        )
    return value


def _check_accent(value: str) -> str:
    if not _ACCENT.fullmatch(value):
        raise ValueError("must be a colour as #rgb or #rrggbb")
    return value


# As field types the checks run only on a value that is set: ``X | None`` skips None.
LogoUrl = Annotated[str, AfterValidator(_check_logo)]
AccentColor = Annotated[str, AfterValidator(_check_accent)]
TenantName = Annotated[str, Field(min_length=1, max_length=200)]
ProxyUrl = Annotated[str, AfterValidator(_check_proxy)]
EncryptionKey = Annotated[SecretStr, AfterValidator(_check_key)]
IpAddresses = Annotated[tuple[str, ...], _every(ipaddress.ip_address, "an IP address")]
Origins = Annotated[tuple[str, ...], _every(_check_origin, "an origin (scheme://host[:port])")]
Networks = Annotated[
    tuple[str, ...],
    _every(functools.partial(ipaddress.ip_network, strict=False), "a CIDR network"),
]


class DatabaseSettings(_Section):
    url: str = "sqlite:///./herald.db"
    """``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or ``postgresql://…``."""
    busy_timeout_seconds: float = Field(default=5.0, gt=0)
    pool_size: int = Field(default=10, ge=2, le=1000)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        scheme = urlsplit(value).scheme
        if scheme == "sqlite":
            if not value.startswith("sqlite:///") or value == "sqlite:///":
                raise ValueError("expected sqlite:///path/to/file.db (three slashes, then a path)")
            return value
        if scheme in ("postgresql", "postgres"):
            return value
        raise ValueError(f"unsupported database URL scheme {scheme!r}; use sqlite or postgresql")

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite file this URL names, or None for another engine."""
        if not self.url.startswith("sqlite:///"):
            return None
        return Path(self.url.removeprefix("sqlite:///"))


class ApiSettings(_Section):
    listen: str = "127.0.0.1:8080"
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    rate_limit_requests: int = Field(default=200, ge=1)
    rate_limit_window_seconds: float = Field(default=10.0, gt=0)
    idempotency_ttl_seconds: float = Field(default=86_400.0, gt=0)
    unauthenticated_rate_limit_requests: int = Field(default=50, ge=1)
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    body_timeout_seconds: float = Field(default=15.0, gt=0)
    max_connections: int = Field(default=1000, ge=1)
    max_connections_per_address: int = Field(default=100, ge=1)
    """Open connections from one client address (an IPv6 client's /64) at most."""
    max_headless_connections: int = Field(default=100, ge=1)
    """Open connections that have sent no request head yet; past it the oldest is closed."""
    max_destinations_per_tenant: int = Field(default=1000, ge=1, le=1_000_000)

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        return _host_port(value)

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:8080")
    return value


AUTO_WORKERS_MAX = 4


CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path | None = None) -> float | None:
    """The CPU quota of this process's cgroup in cores (a container's ``cpus``, a
    Kubernetes CPU limit), or None when there is none. cgroup v2, then v1."""
    root = CGROUP_ROOT if root is None else root
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


def auto_worker_processes() -> int:
    """``worker_processes = "auto"``: one attempt process per usable core, up to
    :data:`AUTO_WORKERS_MAX`; with one core the daemon makes the attempts itself.

    Usable cores: those the process may run on, and no more than its cgroup's CPU
    quota (rounded down): a container limited to one CPU on a 32-core node gets 1,
    not 4 children competing for one CPU's time and the memory limit. Beyond a few
    children the one process that does the database work is the limit."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        cores = min(cores, max(1, int(quota)))
    return 1 if cores < 2 else min(cores, AUTO_WORKERS_MAX)


class DeliverySettings(_Section):
    backoff_base_seconds: float = Field(default=30.0, gt=0)
    max_retries: int = Field(default=10, ge=0, le=30)
    webhook_timeout_seconds: float = Field(default=5.0, gt=0, le=300)
    adapter_timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    max_concurrency: int = Field(default=256, ge=1, le=10_000)
    max_per_destination: int = Field(default=64, ge=1, le=10_000)
    max_per_tenant: int | None = Field(default=None, ge=1, le=10_000)
    """Attempts in flight at once for one tenant; unset: ``max_concurrency`` less one
    destination's share, at least half of it (see :attr:`tenant_cap`)."""
    worker_processes: int = Field(default_factory=auto_worker_processes, ge=1, le=64)
    claim_batch_size: int = Field(default=512, ge=1, le=10_000)
    lease_seconds: float = Field(default=300.0, gt=0)
    heartbeat_seconds: float = Field(default=5.0, gt=0, le=3600)
    instance_timeout_seconds: float = Field(default=30.0, gt=0)
    idle_poll_seconds: float = Field(default=1.0, gt=0, le=60)
    retry_after_max_seconds: float = Field(default=86_400.0, ge=0)
    shutdown_grace_seconds: float = Field(default=10.0, ge=0)
    eventbridge_source: str = Field(default="herald", min_length=1)
    webhook_proxy: ProxyUrl | None = None
    webhook_source_addresses: IpAddresses = ()
    replay_rate_per_second: float = Field(default=500.0, ge=0)
    breaker_failures: int = Field(default=5, ge=1, le=10_000)
    """Consecutive failed attempts that open a destination's circuit (when its
    ``circuit_breaker`` is on; docs/flow-control.md)."""
    breaker_cooldown_seconds: float = Field(default=30.0, gt=0, le=86_400)
    """How long an opened circuit waits before its one probe."""
    breaker_max_cooldown_seconds: float = Field(default=900.0, gt=0, le=86_400)
    """The most the cooldown grows to, doubled after each failed probe."""

    @property
    def breaker(self) -> BreakerSettings:
        """The ``breaker_*`` settings, as the store applies them (herald.flow)."""
        return BreakerSettings(
            self.breaker_failures,
            self.breaker_cooldown_seconds,
            max(self.breaker_max_cooldown_seconds, self.breaker_cooldown_seconds),
        )

    @field_validator("worker_processes", mode="before")
    @classmethod
    def _auto_workers(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return auto_worker_processes()
        return value

    @property
    def tenant_cap(self) -> int:
        """``max_per_tenant``; unset, ``max_concurrency`` less ``max_per_destination``
        (at least half of ``max_concurrency``): one tenant's hanging receivers always
        leave the others a full destination's share (64 of 256 by default), while its
        own healthy destinations still have room beside two hanging ones (192 − 2 × 64)."""
        if self.max_per_tenant is not None:
            return self.max_per_tenant
        rest = self.max_concurrency - self.max_per_destination
        return max(1, self.max_concurrency // 2, rest)

    @model_validator(mode="after")
    def _timeout_spans_heartbeats(self) -> DeliverySettings:
        if self.instance_timeout_seconds < 2 * self.heartbeat_seconds:
            raise ValueError(
                f"instance_timeout_seconds ({self.instance_timeout_seconds:g}) must be at least"
                f" twice heartbeat_seconds ({self.heartbeat_seconds:g}), or one late heartbeat"
                " declares a live instance dead"
            )
        return self


class RelaySettings(_Section):
    batch_size: int = Field(default=500, ge=1, le=10_000)
    poll_interval_seconds: float = Field(default=0.02, gt=0, le=60)
    idle_poll_seconds: float = Field(default=1.0, gt=0, le=60)
    max_payload_bytes: int = Field(default=1_048_576, ge=1024)


SOURCE_COLUMNS = (
    "seq",
    "id",
    "tenant_id",
    "type",
    "data",
    "created_at",
    "traceparent",
    "ordering_key",
)
"""The outbox columns a source's table has, by Herald's names (``columns`` renames them)."""
SOURCE_OPTIONAL_COLUMNS = frozenset({"tenant_id", "created_at", "traceparent", "ordering_key"})
"""Columns a source's table may lack (mapped to ``""``): every row is then the default
tenant's, created when Herald reads it, without a trace context or an ordering key."""
SOURCE_DIALECTS = {"postgresql": "postgresql", "postgres": "postgresql", "mysql": "mysql"}
_SOURCE_NAME = re.compile(r"[a-z0-9_-]{1,32}")
_SQL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
BUILTIN_SOURCE = "herald"
"""The name the built-in outbox (Herald's own ``herald_outbox``) goes by in labels."""


def _check_sql_name(value: str, *, dotted: bool = False) -> str:
    parts = value.split(".") if dotted else [value]
    if len(parts) > 2 or not all(_SQL_NAME.fullmatch(p) for p in parts):
        what = "[schema.]name" if dotted else "name"
        raise ValueError(
            f"{value!r} is not a plain SQL {what} (letters, digits and _, not starting"
            " with a digit, at most 63 characters)"
        )
    return value


class SourceSettings(_Section):
    """One outbox source: a producer's own database Herald reads an outbox table of."""

    name: str
    """``[a-z0-9_-]{1,32}``: labels the source's metrics, log lines and rejected rows."""
    url: str
    """``postgresql://…``, ``mysql://…`` (MySQL 8.0+, MariaDB 10.6+) or ``sqlite:///path``."""
    table: str = "herald_outbox"
    columns: dict[str, str] = Field(default_factory=dict)
    """Herald's column name -> the table's, for a table with other names; ``""`` for an
    optional column the table lacks (``tenant_id``, ``created_at``, ``traceparent``,
    ``ordering_key``)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _SOURCE_NAME.fullmatch(value):
            raise ValueError("expected 1 to 32 of a-z, 0-9, _ and -")
        if value == BUILTIN_SOURCE:
            raise ValueError(f"{BUILTIN_SOURCE!r} is the built-in outbox's name")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        scheme = urlsplit(value).scheme
        if scheme == "sqlite":
            if not value.startswith("sqlite:///") or value == "sqlite:///":
                raise ValueError("expected sqlite:///path/to/file.db (three slashes, then a path)")
            return value
        if scheme not in SOURCE_DIALECTS:
            raise ValueError(
                f"unsupported source URL scheme {scheme!r}; use postgresql, mysql or sqlite"
            )
        if not urlsplit(value).hostname or not urlsplit(value).path.strip("/"):
            raise ValueError(f"expected {scheme}://user:password@host[:port]/database")
        return value

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        return _check_sql_name(value, dotted=True)

    @field_validator("columns")
    @classmethod
    def _columns(cls, value: dict[str, str]) -> dict[str, str]:
        for key, column in value.items():
            if key not in SOURCE_COLUMNS:
                raise ValueError(f"{key!r} is not an outbox column ({', '.join(SOURCE_COLUMNS)})")
            if column == "" and key not in SOURCE_OPTIONAL_COLUMNS:
                raise ValueError(f"the {key} column cannot be left out")
            if column:
                _check_sql_name(column)
        return value

    @property
    def dialect(self) -> str:
        """``postgresql``, ``mysql`` or ``sqlite``."""
        scheme = urlsplit(self.url).scheme
        return SOURCE_DIALECTS.get(scheme, scheme)

    def column(self, name: str) -> str:
        """The table's column for Herald's ``name`` (``""``: the table has none)."""
        return self.columns.get(name, name)


class OutboxSettings(_Section):
    sources: tuple[SourceSettings, ...] = ()
    """External outboxes, besides the built-in ``herald_outbox`` (always read)."""

    @field_validator("sources")
    @classmethod
    def _unique(cls, value: tuple[SourceSettings, ...]) -> tuple[SourceSettings, ...]:
        seen: set[str] = set()
        for source in value:
            if source.name in seen:
                raise ValueError(f"two sources are named {source.name!r}")
            seen.add(source.name)
        return value


class SecuritySettings(_Section):
    allow_private_networks: bool = False
    allowed_networks: Networks = ()
    ambient_credentials_tenants: tuple[str, ...] = ()
    """Tenants whose keyless cloud destinations may use the daemon's own identity
    (its IAM role, workload identity, …); none unless listed."""
    encryption_key: EncryptionKey | None = None
    encryption_key_file: Path | None = None
    previous_encryption_keys: tuple[SecretStr, ...] = ()
    """Keys that still decrypt credentials written before a rotation; never used to encrypt."""

    @field_validator("previous_encryption_keys")
    @classmethod
    def _keys(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        # Checked as a whole so that the message says "[i]: …" after the key's name.
        return tuple(_check_key(key, where=f"[{i}]: ") for i, key in enumerate(value))


class RetentionSettings(_Section):
    days: float = Field(default=30.0, ge=0)
    interval_seconds: float = Field(default=3600.0, gt=0)
    batch_size: int = Field(default=5000, ge=1, le=100_000)


class SignalsSettings(_Section):
    """Herald's operational events (``herald.…``), delivered to the tenant's destinations
    that subscribe to them."""

    failing_after_attempts: int = Field(default=5, ge=1, le=10_000)
    """Consecutive failed attempts to one destination that make it failing
    (``herald.destination.failing``, once per episode)."""


class CatalogSettings(_Section):
    """The tenants' event-type catalogs (docs/catalog-and-filters.md)."""

    require_known_types: bool = False
    """Refuse an event whose type is not in its tenant's catalog (422 at
    ``POST /v2/events``, ``unknown_type`` for an outbox row); Herald's own types pass."""


class MetricsSettings(_Section):
    refresh_seconds: float = Field(default=5.0, gt=0)
    per_destination: bool = False
    listen: str | None = None
    """HOST:PORT of a listener of its own for /metrics (and /healthz, /readyz), which
    then leaves the API's; None: /metrics is served on api.listen."""

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        return None if value is None else _host_port(value)

    @property
    def host(self) -> str:
        return (self.listen or "").rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int((self.listen or ":0").rpartition(":")[2])


class ConsoleSettings(_Section):
    """The web console at ``/console/`` on the API listener."""

    enabled: bool = True
    session_idle_minutes: float = Field(default=30.0, gt=0)
    session_max_hours: float = Field(default=12.0, gt=0)
    secure_cookie: bool = False
    """Mark the session cookie Secure even when the request came in over plain HTTP
    (behind a proxy that terminates TLS); over HTTPS it always is."""
    portal_frame_ancestors: Origins = ()
    """Origins (``https://app.example.com``) whose pages may frame the tenant portal;
    empty: the portal cannot be framed. The console never can."""
    portal_name: str = Field(default="Herald", min_length=1, max_length=80)
    """The product name the portal shows its tenants (header and page titles)."""
    portal_logo_url: LogoUrl | None = None
    """A logo the portal shows beside its name: a path on Herald's own origin
    (``/brand/logo.svg``, served by the proxy in front) or a ``data:image/…;base64,``
    URL; nothing else loads under the portal's Content-Security-Policy."""
    portal_accent_color: AccentColor | None = None
    """The portal's accent (links, the current tab, focus rings): ``#rgb`` or
    ``#rrggbb``; none: the console's blue."""
    tenant_names: dict[str, TenantName] = Field(default_factory=dict, max_length=100_000)
    """Display names by tenant id (``{ acme = "Acme Corp" }``): the portal names its
    tenant by this, not by the raw id (a tenant without one is shown its id)."""


class LogSettings(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console", "auto"] = "auto"

    @field_validator("level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


class TracingSettings(_Section):
    otlp_endpoint: str = ""
    """OTLP/HTTP base URL (``http://collector:4318``); empty: no tracing, nothing imported."""
    service_name: str = Field(default="herald", min_length=1, max_length=200)


class Settings(BaseSettings):
    """The whole configuration; sections mirror the TOML tables."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        case_sensitive=False,
    )

    database: DatabaseSettings = DatabaseSettings()
    api: ApiSettings = ApiSettings()
    delivery: DeliverySettings = Field(default_factory=DeliverySettings)
    relay: RelaySettings = RelaySettings()
    outbox: OutboxSettings = OutboxSettings()
    security: SecuritySettings = SecuritySettings()
    retention: RetentionSettings = RetentionSettings()
    signals: SignalsSettings = SignalsSettings()
    catalog: CatalogSettings = CatalogSettings()
    metrics: MetricsSettings = MetricsSettings()
    console: ConsoleSettings = ConsoleSettings()
    log: LogSettings = LogSettings()
    tracing: TracingSettings = TracingSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's values arrive as init kwargs; the environment overrides them.
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _separate_listeners(self) -> Settings:
        if self.metrics.listen is not None and self.metrics.listen == self.api.listen:
            raise ValueError("metrics.listen must differ from api.listen (or be left unset)")
        return self

    def key_file(self) -> Path | None:
        """Where the generated encryption key lives when none is configured."""
        if self.security.encryption_key_file is not None:
            return self.security.encryption_key_file
        db = self.database.sqlite_path
        return None if db is None else db.with_name(db.name + ".key")


def env_name(key: str) -> str:
    """The environment variable of a dotted setting: ``delivery.max_retries`` is
    ``HERALD_DELIVERY__MAX_RETRIES``."""
    return ENV_PREFIX + key.replace(".", "__").upper()


def _keys() -> dict[str, list[str]]:
    """Every section's keys, by section."""
    out: dict[str, list[str]] = {}
    for name, field in Settings.model_fields.items():
        model = field.annotation
        out[name] = list(model.model_fields) if isinstance(model, type) else []
    return out


def _nearest(key: str) -> str | None:
    """The known dotted key closest to a mistyped one, if any is close."""
    sections = _keys()
    section, _, rest = key.partition(".")
    if section in sections:
        found = difflib.get_close_matches(rest, sections[section], n=1, cutoff=0.6)
        return f"{section}.{found[0]}" if found else None
    dotted = [f"{s}.{k}" for s, keys in sections.items() for k in keys]
    found = difflib.get_close_matches(key, [*sections, *dotted], n=1, cutoff=0.6)
    return found[0] if found else None


def _from_env(key: str) -> str | None:
    """The ``HERALD_…`` variable that set ``key``, if one did (the environment wins)."""
    name = env_name(key)
    return next((var for var in os.environ if var.upper() == name), None)


def mistyped_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """``HERALD_…`` variables that look meant for a setting but name none, each with
    what it should be: pydantic-settings would ignore them without a word.

    Only variables that start with a section's name count (``HERALD_DELIVERY_…``,
    ``HERALD_API__…``): others (``HERALD_REQUIRE_SERVICES``) belong to someone else.
    """
    sections = _keys()
    problems = []
    for var in environ if environ is not None else os.environ:
        upper = var.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        rest = upper[len(ENV_PREFIX) :].lower()
        section = next((s for s in sections if rest.startswith(s + "_")), None)
        if section is None:
            continue
        key = rest[len(section) :].lstrip("_")
        if rest.startswith(section + "__") and (key in sections[section] or not key):
            continue
        nearest = _nearest(f"{section}.{key}")
        hint = f"; did you mean {env_name(nearest)}?" if nearest else ""
        problems.append(f"{var} is not a setting (HERALD_<SECTION>__<KEY>){hint}")
    return problems


def _describe(errors: list[Any]) -> str:
    lines = []
    for err in errors:
        key = ".".join(str(part) for part in err["loc"]) or "(root)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
            if nearest := _nearest(key):
                msg += f"; did you mean {nearest}?"
        elif (
            "input" in err
            and not isinstance(err["input"], dict | list)
            and "encryption_key" not in key  # never echo a key, even a malformed one
        ):
            got = err["input"]
            msg = f"{msg} (got {mask_secrets(got) if isinstance(got, str) else got!r})"
        if (var := _from_env(key)) is not None:
            key = f"{var} ({key})"
        lines.append(f"{key}: {msg}")
    return "; ".join(lines)


def load_settings(path: Path | None = None) -> Settings:
    """Read ``path`` (TOML, optional) and ``HERALD_…`` variables into validated settings."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from exc
    where = f"config {path}" if path else "config"
    # A top-level "_…" key would reach pydantic-settings as an option of its own
    # (``_env_file``, ``_secrets_dir``, ``_cli_parse_args``), not as a setting.
    if odd := sorted(key for key in data if key.startswith("_")):
        raise ConfigError(f"{where}: {odd[0]}: unknown key")
    if mistyped := mistyped_variables():
        raise ConfigError(f"environment: {'; '.join(mistyped)}")
    try:
        return Settings(**data)
    except pydantic.ValidationError as exc:
        raise ConfigError(f"{where}: {_describe(exc.errors())}") from exc
    except SettingsError as exc:  # a HERALD_… variable of a section that is not JSON
        raise ConfigError(f"environment: {exc}") from exc


MASK = "********"


def risky_settings(settings: Settings) -> list[str]:
    """What ``check-config`` warns about: settings that run accepts but that widen what
    a tenant can do with the host's privileges."""
    found: list[str] = []
    tenants = settings.security.ambient_credentials_tenants
    if tenants:
        found.append(
            "security.ambient_credentials_tenants lets "
            + ", ".join(repr(t) for t in tenants)
            + " publish with this host's own cloud identity (its IAM role, workload"
            " identity, environment credentials): keyless AWS and GCP destinations of"
            " these tenants act as the host"
        )
    return found


def mask_secrets(value: str) -> str:
    """``value`` with the password of a URL in it replaced by ``********``: the one
    after ``user:`` (``postgresql://user:PASSWORD@host/db``, a proxy's
    ``http://user:PASSWORD@host:port``) and any ``…password=`` query parameter.
    Anything that is not such a URL comes back as it is."""
    try:
        parts = urlsplit(value)
    except ValueError:  # a URL urlsplit cannot read (a bad "[" host): whole, if in doubt
        return MASK if "@" in value or "password" in value.lower() else value
    if not parts.scheme:
        return value
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}{colon and ':' + MASK}@{hostport}"
    query = "&".join(
        f"{name}={MASK}" if name.lower().endswith("password") and sep else f"{name}{sep}{v}"
        for name, sep, v in (pair.partition("=") for pair in parts.query.split("&"))
    )
    if (netloc, query) == (parts.netloc, parts.query):
        return value
    return SplitResult(parts.scheme, netloc, parts.path, query, parts.fragment).geturl()


def _mask_strings(data: Any) -> Any:
    if isinstance(data, str):
        return mask_secrets(data)
    if isinstance(data, dict):
        return {k: _mask_strings(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_mask_strings(v) for v in data]
    return data


def masked(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain data, secrets replaced by ``********``: the
    keys, and the password of every URL (``database.url``, proxies)."""
    out: dict[str, Any] = _mask_strings(settings.model_dump(mode="json"))
    key = settings.security.encryption_key
    out["security"]["encryption_key"] = None if key is None else MASK
    out["security"]["previous_encryption_keys"] = [
        MASK for _ in settings.security.previous_encryption_keys
    ]
    return out


# A URL's password in free text (a library's message quoting a URL): ``scheme://user:…@``.
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/?#@:]*:)[^\s/?#@]+@")
_SHORTEST_SECRET = 4  # shorter values would mask ordinary words, not secrets


def operator_secrets(settings: Settings) -> tuple[str, ...]:
    """Every secret of the operator's that a library message could quote, for
    :class:`Redactor`: the password of every URL in the settings (``database.url``,
    ``delivery.webhook_proxy``, and any URL a section adds, such as an outbox
    source's) as written, percent-decoded and as the Basic credentials sent for it,
    and the encryption keys. A new secret that is not in a URL is added here."""
    found: set[str] = set()
    for value in _strings(settings.model_dump(mode="python")):
        found.update(_url_secrets(value))
    keys = [settings.security.encryption_key, *settings.security.previous_encryption_keys]
    found.update(key.get_secret_value() for key in keys if key is not None)
    # Longest first: a secret that contains another is masked whole.
    return tuple(sorted((s for s in found if len(s) >= _SHORTEST_SECRET), key=len, reverse=True))


def _strings(data: Any) -> Iterator[str]:
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for value in data.values():
            yield from _strings(value)
    elif isinstance(data, list | tuple):
        for value in data:
            yield from _strings(value)


def _url_secrets(value: str) -> set[str]:
    """The password of the URL ``value`` (userinfo or ``…password=`` parameter), in
    the forms it travels in; nothing when ``value`` is no such URL."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return set()
    if not parts.scheme or not parts.netloc:
        return set()
    out: set[str] = set()
    userinfo, at, _ = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if at and colon and password:
        plain = f"{unquote(user)}:{unquote(password)}"
        out.update((password, unquote(password), base64.b64encode(plain.encode()).decode()))
    for name, _, raw in (pair.partition("=") for pair in parts.query.split("&")):
        if name.lower().endswith("password") and raw:
            out.update((raw, unquote(raw), unquote_plus(raw)))
    return out


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` and any URL's password replaced by ``********``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return _URL_PASSWORD.sub(rf"\1{MASK}@", text) if "://" in text else text


class Redactor:
    """The one masking step every recorded attempt's error and excerpt goes through
    (herald.attempt), and with it every place that shows them: the API, the console,
    the portal, the CLI, the log and the operational events' ``last_error``."""

    __slots__ = ("secrets",)

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = tuple(secrets)

    @classmethod
    def of(cls, settings: Settings) -> Redactor:
        return cls(operator_secrets(settings))

    def __call__(self, text: str | None) -> str | None:
        return None if text is None else redact(text, self.secrets)
