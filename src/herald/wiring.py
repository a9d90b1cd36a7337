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
from typing import IO

from herald.adapters.base import AdapterContext
from herald.adapters.registry import Registry
from herald.catalog import Catalog
from herald.config import DeliverySettings, Settings
from herald.crypto import SecretBox, load_or_create_key_file, parse_key
from herald.dispatch import Limits
from herald.egress import EgressPolicy
from herald.errors import ConfigError, StorageError
from herald.retry import RetryPolicy
from herald.service import DestinationService
from herald.store import Store, make_store


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
    return EgressPolicy(
        allow_private=settings.security.allow_private_networks,
        allowed_networks=tuple(
            ipaddress.ip_network(c, strict=False) for c in settings.security.allowed_networks
        ),
    )


def retry_policy(settings: Settings) -> RetryPolicy:
    d = settings.delivery
    return RetryPolicy(
        base_seconds=d.backoff_base_seconds,
        max_retries=d.max_retries,
        retry_after_max_seconds=d.retry_after_max_seconds,
    )


def delivery_limits(d: DeliverySettings) -> Limits:
    return Limits(
        max_concurrency=d.max_concurrency,
        max_per_destination=d.max_per_destination,
        claim_batch=d.claim_batch_size,
        lease_seconds=d.lease_seconds,
        idle_poll=d.idle_poll_seconds,
        shutdown_grace=d.shutdown_grace_seconds,
    )


@dataclass
class Components:
    settings: Settings
    store: Store
    registry: Registry
    catalog: Catalog
    policy: RetryPolicy
    service: DestinationService


@contextlib.asynccontextmanager
async def components(settings: Settings) -> AsyncIterator[Components]:
    """Open the store and build the service layer (for CLI commands and the daemon)."""
    box = secret_box(settings)
    store = make_store(settings, box)
    await store.open()
    registry = Registry(AdapterContext(settings=settings, egress=egress_policy(settings)))
    catalog = Catalog(store, registry)
    policy = retry_policy(settings)
    service = DestinationService(store, registry, policy, catalog=catalog)
    try:
        yield Components(settings, store, registry, catalog, policy, service)
    finally:
        await registry.close()
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
                " SQLite allows one instance — use PostgreSQL to run several"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
