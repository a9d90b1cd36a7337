"""Wiring: build the parts of a Herald process from its settings.

The factories that the daemon, the worker processes and the CLI share: keys, the
store and service layer (:func:`components`), limits, and the SQLite instance lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from herald.access import Access
from herald.config import DeliverySettings, Settings, risky_settings
from herald.crypto import SecretBox, load_or_create_key_file, parse_key, read_key_file
from herald.errors import ConfigError, StorageError
from herald.store import Store, make_store

# The service layer, the adapters (and aiohttp with them) and the sources' drivers
# are imported by the functions that build them: a CLI command to keys needs the
# store alone (:func:`access_store`), and these imports were most of its time.
if TYPE_CHECKING:
    from herald.adapters.registry import Registry
    from herald.catalog import Catalog
    from herald.dispatch import Limits
    from herald.egress import EgressPolicy
    from herald.retry import RetryPolicy
    from herald.service import Operations


def encryption_key(settings: Settings) -> bytes:
    """The key for credentials at rest: configured, or generated beside the SQLite file."""
    if settings.security.encryption_key is not None:
        return parse_key(settings.security.encryption_key.get_secret_value())
    path = settings.key_file()
    if path is None:
        raise ConfigError(
            "security.encryption_key (or security.encryption_key_file) is required"
            " when the database is not SQLite"
        )
    return load_or_create_key_file(path)


def previous_keys(settings: Settings) -> list[bytes]:
    """``security.previous_encryption_keys``: keys that only decrypt (after a rotation)."""
    return [parse_key(k.get_secret_value()) for k in settings.security.previous_encryption_keys]


def secret_box(settings: Settings) -> SecretBox:
    """The box for credentials at rest: the current key, plus the previous ones to read."""
    return SecretBox(encryption_key(settings), previous_keys(settings))


def egress_policy(settings: Settings) -> EgressPolicy:
    from herald.egress import EgressPolicy

    return EgressPolicy(
        allow_private=settings.security.allow_private_networks,
        allowed_networks=tuple(
            ipaddress.ip_network(c, strict=False) for c in settings.security.allowed_networks
        ),
    )


def retry_policy(settings: Settings) -> RetryPolicy:
    from herald.retry import RetryPolicy

    d = settings.delivery
    return RetryPolicy(
        base_seconds=d.backoff_base_seconds,
        max_retries=d.max_retries,
        retry_after_max_seconds=d.retry_after_max_seconds,
    )


def delivery_limits(d: DeliverySettings) -> Limits:
    from herald.dispatch import Limits

    return Limits(
        max_concurrency=d.max_concurrency,
        max_per_destination=d.max_per_destination,
        max_per_tenant=d.tenant_cap,
        claim_batch=d.claim_batch_size,
        lease_seconds=d.lease_seconds,
        idle_poll=d.idle_poll_seconds,
        shutdown_grace=d.shutdown_grace_seconds,
        breaker_failures=d.breaker_failures,
    )


@dataclass
class Components:
    settings: Settings
    store: Store
    registry: Registry
    catalog: Catalog
    policy: RetryPolicy
    service: Operations
    """What callers may do, built once per process (the daemon listens to its changes)."""
    access: Access
    """Who may call: keys, sessions, tokens, idempotency, rate budgets."""


@contextlib.asynccontextmanager
async def components(
    settings: Settings, *, box: SecretBox | None = None
) -> AsyncIterator[Components]:
    """Open the store and build the service layer (for CLI commands and the daemon);
    ``box`` seals credentials instead of the settings' keys (a key rotation's)."""
    from herald.adapters.base import AdapterContext
    from herald.adapters.registry import Registry
    from herald.catalog import Catalog
    from herald.service import Operations

    async with opened_store(settings, box=box) as store:
        registry = Registry(AdapterContext(settings=settings, egress=egress_policy(settings)))
        catalog = Catalog(store, registry, require_known_types=settings.catalog.require_known_types)
        policy = retry_policy(settings)
        service = Operations(
            store,
            registry,
            policy,
            catalog=catalog,
            max_destinations_per_tenant=settings.api.max_destinations_per_tenant,
        )
        try:
            yield Components(
                settings, store, registry, catalog, policy, service, Access(store, settings)
            )
        finally:
            await registry.close()


@contextlib.asynccontextmanager
async def access_store(settings: Settings) -> AsyncIterator[Access]:
    """Open the store and build :class:`~herald.access.Access` alone: what the CLI's
    key commands need, without the service layer and the adapters."""
    async with opened_store(settings) as store:
        yield Access(store, settings)


@contextlib.asynccontextmanager
async def opened_store(settings: Settings, *, box: SecretBox | None = None) -> AsyncIterator[Store]:
    """The settings' store, opened, and closed on the way out; ``box`` as in
    :func:`components`."""
    store = make_store(settings, box or secret_box(settings))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


class InstanceLock:
    """SQLite is single-instance: a second ``herald run`` on the same file must refuse."""

    def __init__(self, db_path: Path) -> None:
        self.path = db_path.with_name(db_path.name + ".lock")
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = self.path.open("a+")
        except OSError as exc:
            # A read-only or full filesystem: say so instead of a traceback.
            raise StorageError(
                f"cannot open the instance lock {self.path}: {exc.strerror}"
            ) from exc
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise ConfigError(
                f"another herald run ({holder}) is already using {self.path.with_suffix('')};"
                " SQLite allows one instance — use PostgreSQL to run several",
                hint=(
                    f"Stop the other herald run ({holder}) first, or give this one a"
                    " database of its own (database.url)."
                ),
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        fh.flush()
        self._fh = fh

    def holder(self) -> str | None:
        """Who holds the lock now (``pid N on HOST``), or None; takes and changes nothing."""
        try:
            fh = self.path.open()
        except OSError:
            return None
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return fh.read().strip() or "another process"
            fcntl.flock(fh, fcntl.LOCK_UN)
            return None

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


@dataclass(frozen=True, slots=True)
class Preflight:
    """What ``herald run`` would meet at start, found without starting it."""

    key: str
    """Where the encryption key for credentials at rest comes from."""
    retry_schedule: list[float]
    """The seconds between a delivery's attempts, in order."""
    listen: str
    """Whether ``api.listen`` can be bound now."""
    database: str | None
    """The database's schema against this version's (None: not asked)."""
    warnings: list[str]
    """Settings run accepts that widen what tenants can do (config.risky_settings)."""
    blockers: tuple[str, ...] = ()
    """What would make ``herald run`` fail right now although the config is valid: a
    listener's port in use, the SQLite file held by another ``herald run``."""
    sources: list[dict[str, object]] | None = None
    """Each outbox source as ``herald.sourcedb.probe`` found it (None: not asked)."""


async def preflight(settings: Settings, *, check_db: bool) -> Preflight:
    """Every start-up check of ``herald run`` that changes nothing: raises ConfigError
    for what ``run`` would refuse, StorageError when ``check_db`` finds the database
    unreachable. Creates no key file and no database."""
    from herald.sourcedb import check_driver, probe
    from herald.store import applied_migrations
    from herald.store.base import load_migrations

    if settings.security.encryption_key is not None:
        parse_key(settings.security.encryption_key.get_secret_value())
        key = "security.encryption_key"
    else:
        path = settings.key_file()
        if path is None:
            encryption_key(settings)  # raises the error run would
            raise AssertionError("unreachable")
        if path.exists():
            read_key_file(path)
            key = f"key file {path}"
        else:
            key = f"key file {path}, generated by the first herald run"
    previous_keys(settings)
    egress_policy(settings)
    for source in settings.outbox.sources:
        check_driver(source)
    api = settings.api
    blockers: list[str] = []
    listen = f"{api.listen} is free"
    listeners = [("api.listen", api.listen, api.host, api.port)]
    if settings.metrics.listen is not None:
        m = settings.metrics
        listeners.append(("metrics.listen", m.listen or "", m.host, m.port))
    for setting, where, host, port in listeners:
        try:
            with socket.create_server((host, port), reuse_port=False):
                pass
        except OSError as exc:
            # The config is valid, but run would fail now: a second daemon on the same
            # config is the usual case.
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            blockers.append(f"{setting} {where} cannot be bound now ({why})")
            if setting == "api.listen":
                listen = f"{where} cannot be bound now ({why}); is herald running?"
    if settings.database.sqlite_path is not None:
        holder = InstanceLock(settings.database.sqlite_path).holder()
        if holder is not None:
            blockers.append(
                f"another herald run ({holder}) is using {settings.database.sqlite_path}"
            )
    database = None
    sources = None
    if check_db:
        dialect = "sqlite" if settings.database.sqlite_path is not None else "postgres"
        known = {version for version, _, _ in load_migrations(dialect)}
        applied = await applied_migrations(settings)
        if applied is None:
            database = "not created yet: herald run creates it"
        elif applied - known:
            raise StorageError(
                f"the database has migrations this herald does not know ({max(applied)} >"
                f" {max(known)}): it was upgraded by a newer version"
            )
        elif known - applied:
            database = (
                f"reachable; schema at {max(applied, default=0)} of {max(known)}:"
                " herald run (or herald migrate) applies the rest"
            )
        else:
            database = f"reachable; schema up to date ({max(known)})"
        sources = [await probe(source) for source in settings.outbox.sources]
    return Preflight(
        key=key,
        retry_schedule=retry_policy(settings).schedule(),
        listen=listen,
        database=database,
        warnings=risky_settings(settings),
        blockers=tuple(blockers),
        sources=sources,
    )
