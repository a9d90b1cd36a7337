"""The store: every operation once, over a :class:`~herald.store.dialect.Dialect`.

The statements are the dialect's named queries (``store/sql/queries.sql`` and
``store/sql/<dialect>/queries.sql``),
called with the same arguments on both databases; what differs (connections,
transactions, list parameters, a few whole algorithms) is the dialect's.

:class:`SQLStore` is one object made of parts, each a module with one job over the
same dialect (see :mod:`herald.store.part`): :mod:`~herald.store.engine` the engine's
path, :mod:`~herald.store.destinations` the destinations,
:mod:`~herald.store.history` deliveries, events and replays as people see them, and
:mod:`~herald.store.access` keys, tokens, sessions, rate limits and idempotency,
:mod:`~herald.store.counters` the per-destination counters the recorder keeps,
:mod:`~herald.store.recent` what is happening now (the overview's and the events list's reads),
:mod:`~herald.store.sources` the rows of outbox sources and their leases,
:mod:`~herald.store.eventtypes` the tenants' event-type catalogs.
The rest of the code types against the whole, ``herald.store.Store``.
"""

from __future__ import annotations

from typing import Generic, Required, TypedDict, TypeVar

from herald.crypto import SecretBox
from herald.flow import BreakerSettings
from herald.signals import DEFAULT_FAILING_AFTER
from herald.store.access import AccessStore
from herald.store.counters import CounterStore
from herald.store.destinations import DestinationStore
from herald.store.dialect import Dialect
from herald.store.engine import EngineStore
from herald.store.eventtypes import EventTypeStore
from herald.store.history import HistoryStore
from herald.store.recent import RecentStore
from herald.store.sources import SourceStore

D = TypeVar("D", bound=Dialect)


class StoreOptions(TypedDict, total=False):
    """What a store takes beside its dialect (:class:`SQLStore`'s keywords), as the
    SQLite and PostgreSQL stores pass them on."""

    box: Required[SecretBox]
    failing_after: int
    breaker: BreakerSettings


class SQLStore(
    EngineStore,
    SourceStore,
    DestinationStore,
    HistoryStore,
    AccessStore,
    CounterStore,
    RecentStore,
    EventTypeStore,
    Generic[D],
):
    """The store (``herald.store.Store``): every operation once, over a dialect.

    ``shared``: whether several instances may use this database at once (PostgreSQL).
    ``failing_after``: the consecutive failed attempts that make a destination
    failing (``signals.failing_after_attempts``, see :mod:`herald.signals`).
    ``breaker``: when circuits open and for how long (``delivery.breaker_*``)."""

    dialect: D

    def __init__(
        self,
        dialect: D,
        *,
        box: SecretBox,
        failing_after: int = DEFAULT_FAILING_AFTER,
        breaker: BreakerSettings | None = None,
    ) -> None:
        self.dialect = dialect
        self.shared = dialect.shared
        self._box = box
        self.failing_after = failing_after
        self.breaker = breaker or BreakerSettings()

    @property
    def marks(self) -> SecretBox:
        """The key that marks Herald's own rows in its outbox (``herald.ingest.Marks``)."""
        return self._box

    # --- lifecycle --------------------------------------------------------
    async def open(self) -> None:
        """Connect and apply pending migrations."""
        await self.dialect.open()

    async def close(self) -> None:
        await self.dialect.close()

    async def ping(self) -> None:
        """Raise StorageError unless the database answers."""
        await self.dialect.ping()

    async def schema_version(self) -> int:
        rows = await self.dialect.read("schema_version")
        return int(rows[0][0] or 0)
