"""What the store's callers and its parts share: records it answers with, the relay's
hand-in, the migrations' loader and the check that refuses a newer schema. The store
itself is :mod:`herald.store.sqlstore`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from herald.errors import StorageError
from herald.model import (
    OutboxRow,
    RelayPlan,
)


@dataclass(frozen=True, slots=True)
class ApiKeyInfo:
    """What is known of an API key: never the key, only its hash and last characters."""

    key_hash: str
    tenant_id: str
    hint: str
    created_at: float
    revoked_at: float | None
    kind: str = "tenant"
    """``tenant`` (opens the API for its tenant) or ``operator`` (opens the console)."""


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """A console session as stored: the operator key it was opened with, never its id."""

    key_hash: str
    created_at: float
    last_seen: float


@dataclass(frozen=True, slots=True)
class TokenRow:
    """A session token that opened: never its value, only what it grants."""

    id: str
    tenant_id: str
    created_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class TokenState:
    """Why a session token did not open (``token_state``): when it was traded,
    revoked, when it expires, and when the API key that made it was revoked."""

    traded_at: float | None
    revoked_at: float | None
    expires_at: float
    key_revoked_at: float | None


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    fingerprint: str
    status: int | None
    """None while the first request is still being handled."""
    body: bytes | None


def load_migrations(dialect: str) -> list[tuple[int, str, str]]:
    """The numbered scripts in ``store/sql/<dialect>``, in order: (version, name, SQL)."""
    from importlib import resources

    folder = resources.files("herald.store") / "sql" / dialect
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


STALE_CATALOG = -1
"""Row count ``Store.relay`` answers when the caller's destination catalog is stale."""

EventKey = tuple[str, str]
"""What identifies an event: ``(tenant_id, id)``. An id is unique per tenant only; two
tenants may use the same one."""

RelayProcessor = Callable[[list[OutboxRow], set[EventKey]], RelayPlan]
"""Turns raw outbox rows (and the keys of those among them already stored as events)
into a plan."""


def check_migrations(known: list[tuple[int, str, str]], done: set[int]) -> None:
    """Refuse a database migrated by a newer Herald than this one."""
    newest = max((v for v, _, _ in known), default=0)
    if done and max(done) > newest:
        raise StorageError(
            f"database schema version {max(done)} is newer than this Herald ({newest});"
            " upgrade Herald"
        )
