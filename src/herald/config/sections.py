"""The sections of the settings, one class a TOML table (``[delivery]``, ``[api]``…);
the outbox's sources are in :mod:`herald.config.sources`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from herald.config.checks import (
    AccentColor,
    EncryptionKey,
    IpAddresses,
    LogoUrl,
    Networks,
    Origins,
    ProxyUrl,
    Section,
    TenantName,
    check_database_url,
    check_key,
)
from herald.flow import BreakerSettings


class DatabaseSettings(Section):
    url: str = "sqlite:///./herald.db"
    """``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or ``postgresql://…``."""
    busy_timeout_seconds: float = Field(default=5.0, gt=0)
    pool_size: int = Field(default=10, ge=2, le=1000)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        return check_database_url(
            value, ("postgresql", "postgres"), what="database", use="sqlite or postgresql"
        )

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite file this URL names, or None for another engine."""
        if not self.url.startswith("sqlite:///"):
            return None
        return Path(self.url.removeprefix("sqlite:///"))


class ApiSettings(Section):
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


class DeliverySettings(Section):
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


class RelaySettings(Section):
    batch_size: int = Field(default=500, ge=1, le=10_000)
    poll_interval_seconds: float = Field(default=0.005, gt=0, le=60)
    idle_poll_seconds: float = Field(default=1.0, gt=0, le=60)
    max_payload_bytes: int = Field(default=1_048_576, ge=1024)


class SecuritySettings(Section):
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
        return tuple(check_key(key, where=f"[{i}]: ") for i, key in enumerate(value))


class RetentionSettings(Section):
    days: float = Field(default=30.0, ge=0)
    interval_seconds: float = Field(default=3600.0, gt=0)
    batch_size: int = Field(default=5000, ge=1, le=100_000)


class SignalsSettings(Section):
    """Herald's operational events (``herald.…``), delivered to the tenant's destinations
    that subscribe to them."""

    failing_after_attempts: int = Field(default=5, ge=1, le=10_000)
    """Consecutive failed attempts to one destination that make it failing
    (``herald.destination.failing``, once per episode)."""


class CatalogSettings(Section):
    """The tenants' event-type catalogs (docs/catalog-and-filters.md)."""

    require_known_types: bool = False
    """Refuse an event whose type is not in its tenant's catalog (422 at
    ``POST /v2/events``, ``unknown_type`` for an outbox row); Herald's own types pass."""


class MetricsSettings(Section):
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


class ConsoleSettings(Section):
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


class LogSettings(Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console", "auto"] = "auto"

    @field_validator("level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


class TracingSettings(Section):
    otlp_endpoint: str = ""
    """OTLP/HTTP base URL (``http://collector:4318``); empty: no tracing, nothing imported."""
    service_name: str = Field(default="herald", min_length=1, max_length=200)
