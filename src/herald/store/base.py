"""The storage interface: everything the engine, service and CLI ask of a database.

One implementation, :class:`~herald.store.sqlstore.SQLStore`, serves both databases
(SQLite and PostgreSQL) through a small dialect. Operations that must be atomic are
single methods; callers never hold a transaction open across awaits of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from herald.model import (
    AttemptRecord,
    Delivery,
    DeliveryFilter,
    Destination,
    DestinationStatus,
    DueDelivery,
    Event,
    Instance,
    NewDelivery,
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

RelayProcessor = Callable[[list[OutboxRow], set[str]], RelayPlan]
"""Turns raw outbox rows (and the ids among them already stored as events) into a plan."""


class Store(Protocol):
    shared: bool
    """Whether several instances may use this database at once (PostgreSQL)."""

    async def open(self) -> None:
        """Connect and apply pending migrations."""

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Raise StorageError unless the database answers."""

    async def schema_version(self) -> int: ...

    # --- outbox ---------------------------------------------------------
    async def relay(
        self, limit: int, process: RelayProcessor, *, destinations_version: int | None = None
    ) -> tuple[RelayPlan, int]:
        """Claim up to ``limit`` outbox rows in ``seq`` order, apply ``process``'s plan
        and delete the rows, all in one transaction; returns the plan and the row count.

        With ``destinations_version``, nothing is claimed and the count is
        ``STALE_CATALOG`` when destinations changed since the caller's catalog was
        built: fanning out with it could miss a destination created just before.

        Deliveries planned with a ``lease_owner`` are stored claimed by it; the
        plan's ``leased`` lists those that really are. One the committed status of
        its destination holds (a change after the version check) is stored unleased
        and due now instead, and one whose destination is gone is not stored."""

    async def insert_outbox(
        self, *, id: str, tenant_id: str, type: str, data: bytes, created_at: str
    ) -> None: ...

    async def outbox_stats(self) -> tuple[int, float | None]:
        """Pending outbox rows and the ``created_at`` epoch of the oldest, if any."""

    async def list_rejected(self, *, limit: int) -> list[dict[str, object]]: ...

    # --- dispatch -------------------------------------------------------
    async def claim_due(
        self,
        *,
        now: float,
        limit: int,
        owner: str,
        lease_until: float,
        exclude_destinations: Sequence[str] = (),
        due_since: float | None = None,
    ) -> list[DueDelivery]:
        """Lease up to ``limit`` due deliveries of unheld destinations, oldest first;
        with ``due_since``, only those due since then (the caller knows that the older
        ones are all of ``exclude_destinations``)."""

    async def renew_leases(self, ids: Sequence[str], *, owner: str, until: float) -> int:
        """Extend the leases ``owner`` holds on ``ids`` (attempts still running)."""

    async def watch_outbox(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` when producers insert outbox rows; False if unsupported."""

    async def record_attempts(self, records: Sequence[AttemptRecord]) -> None:
        """Store attempts and move their deliveries on, in one transaction."""

    async def next_due_at(self) -> float | None:
        """Earliest ``next_attempt_at`` of an unheld pending delivery."""

    async def release_leases(self, *, owner: str | None, now: float) -> int:
        """Make leased deliveries due now (``owner`` None: every owner's)."""

    async def delivery_counts(self, *, now: float) -> dict[str, int]:
        """Pending deliveries by state: ``due``, ``scheduled_retry``, ``held``."""

    # --- instances --------------------------------------------------------
    async def heartbeat(self, instance: Instance, *, now: float) -> bool:
        """Record that ``instance`` lives; False if its row was missing (new, or reaped)."""

    async def reap_instances(self, *, stale_before: float, now: float) -> dict[str, int]:
        """Forget instances silent since before ``stale_before`` and make the deliveries
        they leased due ``now``, in one transaction; ``{instance id: released}``."""

    async def list_instances(self) -> list[Instance]:
        """Every registered instance, oldest first."""

    async def remove_instance(self, instance_id: str) -> None:
        """Unregister an instance that stops cleanly."""

    # --- destinations ---------------------------------------------------
    async def destinations_version(self) -> int:
        """A counter bumped by every change to any destination."""

    async def destination_counts(self) -> list[tuple[str, str, int]]:
        """(type, status, count) of live destinations."""

    async def all_destinations(self) -> list[Destination]:
        """Every destination that is not deleted (for the fan-out index)."""

    async def create_destination(
        self, dest: Destination, *, verification: tuple[Event, NewDelivery] | None
    ) -> None: ...

    async def update_destination(
        self,
        dest: Destination,
        *,
        verification: tuple[Event, NewDelivery] | None = None,
        expected_updated_at: float | None = None,
    ) -> bool:
        """Write every field of ``dest``; hold or release its deliveries to match
        its status; a new verification supersedes a pending one.

        With ``expected_updated_at``, write only if the stored row still has that
        ``updated_at`` (optimistic concurrency); returns whether it wrote."""

    async def get_destination(self, tenant_id: str | None, dest_id: str) -> Destination | None:
        """A destination by id (deleted ones too), scoped to a tenant unless None."""

    async def list_destinations(
        self,
        *,
        tenant_id: str,
        status: DestinationStatus | None,
        type: str | None,
        before_id: str | None,
        limit: int,
    ) -> list[Destination]:
        """Live destinations, newest first, ids strictly below ``before_id``."""

    async def delete_destination(self, tenant_id: str, dest_id: str, *, now: float) -> bool:
        """Soft-delete; pending deliveries to it end as ``failure``."""

    # --- deliveries and events -------------------------------------------
    async def insert_deliveries(
        self, events: Sequence[Event], deliveries: Sequence[NewDelivery]
    ) -> None: ...

    async def get_delivery(
        self, tenant_id: str | None, delivery_id: str, *, with_attempts: bool
    ) -> Delivery | None: ...

    async def list_deliveries(
        self, flt: DeliveryFilter, *, before_id: str | None, limit: int
    ) -> list[Delivery]:
        """Deliveries matching ``flt``, newest first, ids strictly below ``before_id``."""

    async def count_deliveries(self, flt: DeliveryFilter) -> int: ...

    async def requeue(self, ids: Sequence[str], *, now: float, max_retries: int) -> int:
        """Finished deliveries start a fresh cycle of attempts; pending ones become due now.
        Deliveries of deleted destinations and test pings are left alone."""

    async def get_event(self, tenant_id: str | None, event_id: str) -> Event | None: ...

    async def get_outbox_event(self, tenant_id: str, event_id: str) -> Event | None:
        """An event still waiting in the outbox, if it parses (for GET right after publish)."""

    # --- API rate limit ---------------------------------------------------
    async def count_request(self, *, tenant_id: str, window_no: int, expire: bool) -> int:
        """Count one request of ``tenant_id`` in fixed window ``window_no``; the window's
        count so far, this one included. ``expire`` also deletes earlier windows."""

    # --- idempotency ------------------------------------------------------
    async def idempotency_begin(
        self, *, tenant_id: str, key: str, fingerprint: str, now: float, ttl: float
    ) -> IdempotencyRecord | None:
        """Reserve ``key``; None when it is new, else the record already there."""

    async def idempotency_finish(
        self, *, tenant_id: str, key: str, status: int, body: bytes
    ) -> None: ...

    async def idempotency_abort(self, *, tenant_id: str, key: str) -> None:
        """Forget a reservation whose request failed, so the client may retry."""

    async def purge(self, *, before: float, limit: int) -> int:
        """Delete up to ``limit`` finished deliveries last changed before ``before``,
        with their attempts, then events and rejected rows left without a use;
        returns how many deliveries went."""

    # --- API keys ---------------------------------------------------------
    async def create_api_key(
        self, *, key_hash: str, tenant_id: str, hint: str, now: float
    ) -> None: ...

    async def tenant_for_key(self, key_hash: str) -> str | None: ...

    async def list_api_keys(self, tenant_id: str) -> list[ApiKeyInfo]:
        """The tenant's keys, newest first, revoked ones included."""

    async def revoke_api_keys(self, *, tenant_id: str, hash_prefix: str, now: float) -> int:
        """Revoke the tenant's unrevoked keys whose hash starts with ``hash_prefix``."""

    # --- key rotation -----------------------------------------------------
    async def reencrypt_secrets(
        self, *, after_id: str | None, limit: int
    ) -> tuple[int, int, str | None]:
        """Re-encrypt under the store's current key, in one transaction, the credentials
        of up to ``limit`` destinations (deleted ones too) with ids above ``after_id``.

        Rows already under the current key are left as they are. Returns the rows looked
        at, the rows rewritten, and the last id looked at (None when none were left).
        Raises CryptoError, naming the destination, if no key of the box opens a row."""
