"""What :class:`~herald.store.sqlstore.SQLStore` asks of a database dialect.

Only what truly differs between SQLite and PostgreSQL: connections and their
transactions, how parameters and lists of them are passed, and the few operations
whose algorithm differs (a claim, a reap, a heartbeat, part of the purge). Every
statement is a named query of ``store/sql/queries.sql`` (both dialects') or
``store/sql/<dialect>/queries.sql`` (this dialect's own way).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple, Protocol, TypeAlias, TypeVar

from herald.model import OutboxRow
from herald.store.queries import load_queries

Conn: TypeAlias = Any
"""The connection a transaction yields (SQLite's writer, or a body's view of it in the
writer's thread, store.sqlitethread; asyncpg's): only the dialect uses it."""
Row: TypeAlias = Sequence[Any]
T = TypeVar("T")


class Claim(NamedTuple):
    """What :meth:`Dialect.claim` leases (see ``Store.claim_due``)."""

    now: float
    limit: int
    owner: str
    lease_until: float
    exclude: Sequence[str]
    due_since: float | None
    exclude_tenants: Sequence[str] = ()


class Dialect(Protocol):
    name: str
    """The folder of its SQL files: ``sqlite`` or ``postgres``."""
    shared: bool
    """Several instances (and so several writers) may use the database at once."""
    idle_read: bool
    """Whether a relay that found the outbox empty should look with a plain read first."""

    async def open(self) -> None:
        """Connect and apply pending migrations; StorageError if that fails."""

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Raise StorageError unless the database answers (and, if so, takes writes)."""

    def tx(self, *, atomic: bool = True) -> AbstractAsyncContextManager[Conn]:
        """A connection to write with, in a transaction unless ``atomic`` is False and
        the dialect can do without one; driver errors leave it as StorageError."""

    async def transact(self, body: Callable[[Conn], Coroutine[Any, Any, T]]) -> T:
        """``body(conn)`` in one write transaction, as ``tx()``'s. A body may await
        nothing but this dialect's statements: SQLite runs it in its writer's thread
        at one go (store.sqlitethread), without a round trip to the event loop
        between statements. The engine's busy transactions are written so."""

    async def read(
        self, name: str, *args: Any, gauges: bool = False, parts: Mapping[str, str] | None = None
    ) -> list[Row]:
        """The rows of query ``name`` outside any transaction (StorageError on failure).
        ``gauges``: a slow count for metrics, kept apart where the dialect can;
        ``parts`` fills the query's ``{slots}`` (built per call, e.g. a filter)."""

    async def execute(self, conn: Conn, name: str, *args: Any) -> int:
        """Run query ``name``; the rows it changed. A list argument must come last."""

    async def fetch(self, conn: Conn, name: str, *args: Any) -> list[Row]: ...

    async def fetchrow(self, conn: Conn, name: str, *args: Any) -> Row | None: ...

    async def fetchval(self, conn: Conn, name: str, *args: Any) -> Any: ...

    async def executemany(self, conn: Conn, name: str, rows: Iterable[Sequence[Any]]) -> None: ...

    async def insert_many(self, conn: Conn, name: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert ``rows`` with query ``name``, as one batch the dialect writes fastest."""

    def param(self, n: int) -> str:
        """The placeholder of the ``n``-th parameter (from 1) in SQL built per call."""

    def any_of(self, column: str, values: Sequence[Any], params: list[Any]) -> str:
        """A clause ``column`` is one of ``values``, its parameters appended to ``params``."""

    def is_unique_violation(self, exc: BaseException | None) -> bool: ...

    def outbox_delete_args(self, rows: Sequence[OutboxRow]) -> tuple[Any, ...]:
        """The arguments of ``relay_delete`` that remove the claimed ``rows``."""

    def oldest_epoch(self, value: Any) -> float | None:
        """``outbox_stats``' oldest ``created_at`` as an epoch, if it has one."""

    async def watch_outbox(
        self, callback: Callable[[], None], *, every: float, listening: asyncio.Event | None = None
    ) -> bool:
        """Call ``callback`` when outbox rows may have been inserted (looking ``every``
        seconds where the database cannot notify); False if unsupported. Where the
        store looks, it looks only while ``listening`` is set (the relay between two
        passes), not while the relay runs one pass after another."""
        ...

    # --- operations whose algorithm differs ------------------------------------------
    async def claim(self, conn: Conn, want: Claim) -> list[Row]:
        """Lease due deliveries: rows (id, destination_id, kind, attempt_count,
        max_attempts, tenant_id, event_id, when it was due, whether its destination is
        under flow control, ordering key) of the common lane (``flow = 0``)."""

    async def claim_flow(
        self, conn: Conn, want: Claim, takes: Sequence[tuple[str, int]]
    ) -> list[Row]:
        """Lease due deliveries of the flow lane (``flow = 1``): of each destination of
        ``takes``, its oldest due by ``want.now``, at most as many as given; none of
        ``want.exclude_tenants``. Rows as :meth:`claim`'s."""

    async def lock_for_attempts(
        self, conn: Conn, every: Sequence[str], must: Sequence[str]
    ) -> list[Row]:
        """Before touching a delivery: the signal state (id, type, consecutive failures,
        failing since) of the live destinations of ``every`` (sorted) that recording
        may change, locked against other writers: those of ``must`` (an attempt
        failed, or a verification activates it) and any not clean now. PostgreSQL
        locks them in id order; SQLite's write lock covers them all."""

    async def heartbeat(self, conn: Conn, row: tuple[Any, ...]) -> bool:
        """Refresh or insert an instance row; whether it was there."""

    async def reap(self, conn: Conn, *, stale_before: float, now: float) -> dict[str, int]: ...

    async def purge_deliveries(
        self, conn: Conn, ids: list[str], *, before: float, limit: int
    ) -> None:
        """Delete deliveries ``ids`` (their attempts are gone), then unused old events."""


class NamedQueries:
    """A dialect's queries, parsed once, and what both drivers do alike with them."""

    name: str

    def __init__(self) -> None:
        self._q = load_queries(self.name)

    async def executemany(self, conn: Conn, name: str, rows: Iterable[Sequence[Any]]) -> None:
        await conn.executemany(self._q[name], rows)
